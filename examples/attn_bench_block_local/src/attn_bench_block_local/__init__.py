"""Block-local attention: an example attn-bench plug-in registered through an entry point."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn import ExactAttention, MaskMod
from attn.contract import require_int


class BlockLocalAttention(ExactAttention):
    """Block-local attention: query i sees key j iff i // block_size == j // block_size."""

    kernels: ClassVar[tuple[str, ...]] = ("reference", "sdpa")
    example_params = ({"block_size": 4}, {"block_size": 1})

    def __init__(self, block_size: int = 64, **common) -> None:
        super().__init__(**common)
        self.block_size = require_int(self.name, "block_size", block_size, minimum=1)

    def mask_mod(self) -> MaskMod:
        size = self.block_size

        def block_local(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return (i // size) == (j // size)

        return block_local
