"""BigBird attention (Zaheer et al. 2020), block-sparse and exact: an attn-bench plug-in.

Positions fall in blocks of ``block_size``; query block ``a`` sees key block ``c`` iff

- window: ``|a - c| <= window_blocks``;
- global: ``a < num_global_blocks`` or ``c < num_global_blocks`` (the first blocks see and
  are seen by every block);
- random: ``c`` is one of query block ``a``'s ``num_random_blocks`` random key blocks, drawn
  once (without replacement, from the ``ceil(max_len / block_size)`` blocks of a ``max_len``
  sequence) by a generator seeded with ``seed``. A query block past ``max_len`` has no
  random blocks; a random block past the call's keys is simply absent.

The rule is a ``mask_mod``, so every kernel that runs a mask runs it and the conformance kit
proves it against the dense reference. Causal and ``key_mask`` apply on top, as for every
exact variant.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from attn import ExactAttention, MaskMod
from attn.validation import Param


def random_blocks(num_blocks: int, per_block: int, seed: int) -> Tensor:
    """``(num_blocks, per_block)`` int64: for each query block, distinct random key blocks."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(num_blocks, generator=gen, device="cpu")[:per_block] for _ in range(num_blocks)]
    return torch.stack(rows) if rows else torch.zeros(0, per_block, dtype=torch.long)


class BigBirdAttention(ExactAttention):
    """BigBird: block window + global blocks + seeded random blocks, exact as a mask."""

    example_params = (
        {"block_size": 4, "window_blocks": 1, "num_global_blocks": 1, "num_random_blocks": 2, "max_len": 128},
        {"block_size": 3, "window_blocks": 0, "num_global_blocks": 0, "num_random_blocks": 1, "seed": 7,
         "max_len": 64},
    )
    param_rules: ClassVar[dict[str, Param]] = {
        "block_size": Param(minimum=1), "window_blocks": Param(minimum=0),
        "num_global_blocks": Param(minimum=0), "num_random_blocks": Param(minimum=0),
        "seed": Param(minimum=0), "max_len": Param(minimum=1),
    }

    def __init__(self, block_size: int = 64, window_blocks: int = 1, num_global_blocks: int = 1,
                 num_random_blocks: int = 3, seed: int = 0, max_len: int = 4096, **common) -> None:
        self.check_params(block_size=block_size, window_blocks=window_blocks, num_global_blocks=num_global_blocks,
                          num_random_blocks=num_random_blocks, seed=seed, max_len=max_len)
        super().__init__(**common)
        self.block_size, self.window_blocks, self.num_global_blocks = block_size, window_blocks, num_global_blocks
        self.num_random_blocks, self.seed, self.max_len = num_random_blocks, seed, max_len
        table = random_blocks(-(-max_len // block_size), num_random_blocks, seed)  # (max blocks, r)
        self.register_buffer("random_table", table, persistent=False)
        # the same table as r contiguous columns, each its own buffer, for the mask_mod: flex's
        # compiled block-mask builder fails on table[row, t] at 64K and its CPU kernel on views
        for t in range(num_random_blocks):
            self.register_buffer(f"random_column_{t}", table[:, t].contiguous(), persistent=False)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        super().check_together(params)
        if {"block_size", "max_len", "num_random_blocks"} <= params.keys():
            blocks = -(-params["max_len"] // params["block_size"])
            if params["num_random_blocks"] > blocks:
                raise ValueError(
                    f"{cls.name}: parameter 'num_random_blocks' must be at most the {blocks} blocks of "
                    f"max_len={params['max_len']}; got {params['num_random_blocks']}"
                )

    def mask_mod(self) -> MaskMod:
        size, window, first = self.block_size, self.window_blocks, self.num_global_blocks
        last = self.random_table.shape[0] - 1
        columns = [getattr(self, f"random_column_{t}") for t in range(self.num_random_blocks)]  # r x (max blocks,)

        def bigbird(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            qb, kb = i // size, j // size
            allowed = ((qb - kb).abs() <= window) | (qb < first) | (kb < first)
            row = qb.clamp(max=last)
            for column in columns:
                allowed = allowed | ((column[row] == kb) & (qb <= last))
            return allowed

        return bigbird

    def extra_repr(self) -> str:
        return (f"block_size={self.block_size}, window_blocks={self.window_blocks}, "
                f"num_global_blocks={self.num_global_blocks}, num_random_blocks={self.num_random_blocks}, "
                f"seed={self.seed}, max_len={self.max_len}, kernel={self.kernel!r}")
