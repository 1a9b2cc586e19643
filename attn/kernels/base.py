"""The kernel interface."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from torch import Tensor

if TYPE_CHECKING:
    from attn.base import Attention, KernelPath
    from attn.call import AttentionCall


class Kernel:
    """An implementation of attention semantics. Stateless apart from caches."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when every new call shape costs a compilation (tests use the kit's quick profile)
    compiles_per_shape: ClassVar[bool] = False

    def not_supported_reasons(self, attention: Attention, call: AttentionCall) -> list[str]:
        """Reasons this kernel cannot run ``attention`` for ``call``; [] = supported.

        Every refusal that depends on the call (device, dtype, causal, gradients, lengths,
        a ``key_mask``) belongs here, not in :meth:`run`: dispatch, ``auto``, the conformance
        kit and the benchmark read it before running. A length the call leaves ``None``
        means "any length": checks of that length do not apply.
        """
        return []

    def exactness_reasons(self, attention: Attention) -> list[str]:
        """[] for an exact variant; else the reason this (exact-attention) kernel cannot run it."""
        if attention.exact:
            return []
        return [f"{attention.name} is approximate; {self.name} computes exact attention only"]

    def run(
        self,
        attention: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, KernelPath]:
        """Compute the attention output ``(B, H, Nq, Dv)`` and describe the path taken."""
        raise NotImplementedError
