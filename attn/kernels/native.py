"""The ``native`` kernel: a variant's own implementation (e.g. Nystromformer)."""

from __future__ import annotations

from torch import Tensor

from attn.call import AttentionCall
from attn.kernels.base import Kernel, KernelPath
from attn.pattern import Pattern


class NativeKernel(Kernel):
    """Runs ``pattern.native.forward``; the variant may declare refusals in ``native.not_supported_reasons``."""

    name = "native"
    description = "the variant's own implementation"
    runs_definitions = False

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        native = pattern.native
        if native is None:
            return [*reasons, f"{pattern.name} has no implementation of its own (native_forward)"]
        if call is not None and native.not_supported_reasons is not None:
            reasons += native.not_supported_reasons(call)
        return reasons

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        native = pattern.native
        if native is None:  # declared above; kept for direct calls
            raise NotImplementedError(f"{pattern.name}: no native implementation (native_forward)")
        out = native.forward(q, k, v, causal, key_mask)  # (B, H, Nq, Dv)
        return out, (native.path() if native.path is not None else KernelPath(self.name, "native"))
