"""Block-local attention: an example attn-bench plug-in registered through an entry point."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn import ExactAttention, MaskMod
from attn.validation import Param


class BlockLocalAttention(ExactAttention):
    """Block-local attention: query i sees key j iff i // block_size == j // block_size."""

    example_params = ({"block_size": 4}, {"block_size": 1})
    param_rules: ClassVar[dict[str, Param]] = {"block_size": Param(minimum=1)}  # checked without building

    def __init__(self, block_size: int = 64, **common) -> None:
        self.check_params(block_size=block_size)
        super().__init__(**common)
        self.block_size = block_size

    def mask_mod(self) -> MaskMod:
        size = self.block_size

        def block_local(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return (i // size) == (j // size)

        return block_local
