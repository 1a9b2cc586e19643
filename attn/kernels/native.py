"""The ``native`` kernel: a variant's own implementation (e.g. Nystromformer)."""

from __future__ import annotations

from attn.kernels.base import Kernel, KernelPath


class NativeKernel(Kernel):
    """Runs ``attention.native_forward``; the variant declares its own support in
    ``native_not_supported_reasons(call) -> list[str]`` (optional: none means any call)."""

    name = "native"
    description = "the variant's own implementation"

    def not_supported_reasons(self, attention, call) -> list[str]:
        reasons = getattr(attention, "native_not_supported_reasons", None)
        return [] if reasons is None else reasons(call)

    def run(self, attention, q, k, v, causal, key_mask):
        out = attention.native_forward(q, k, v, causal, key_mask)
        path = getattr(attention, "native_path", None)
        return out, (path() if path is not None else KernelPath(self.name, "native"))
