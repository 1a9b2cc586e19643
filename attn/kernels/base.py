"""The kernel interface."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attn.base import Attention, KernelPath


class Kernel:
    """An implementation of attention semantics. Stateless apart from caches."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when every new call shape costs a compilation (tests use the kit's quick profile)
    compiles_per_shape: ClassVar[bool] = False

    def supports(
        self,
        attention: Attention,
        device: torch.device,
        dtype: torch.dtype,
        causal: bool,
        requires_grad: bool,
    ) -> list[str]:
        """Reasons this kernel cannot run ``attention`` for such a call; [] = supported."""
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
