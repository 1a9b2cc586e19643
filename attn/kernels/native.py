"""The ``native`` kernel: a variant's own implementation (e.g. Nystromformer)."""

from __future__ import annotations

from attn.base import KernelPath
from attn.kernels.base import Kernel


class NativeKernel(Kernel):
    """Runs ``attention.native_forward``; the variant declares its own support."""

    name = "native"
    description = "the variant's own implementation"

    def supports(self, attention, device, dtype, causal, requires_grad) -> list[str]:
        reasons = getattr(attention, "native_supports", None)
        return [] if reasons is None else reasons(device, dtype, causal, requires_grad)

    def run(self, attention, q, k, v, causal, key_mask):
        out = attention.native_forward(q, k, v, causal, key_mask)
        path = getattr(attention, "native_path", None)
        return out, (path() if path is not None else KernelPath(self.name, "native"))
