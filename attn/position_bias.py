"""Relative position biases as score_mods: learned per-head per-offset scalars, and ALiBi."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attn.mods import ScoreMod
from attn.pattern import RelativeBias
from attn.validation import require_choice

POSITION_BIASES = ("learned", "alibi")


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al. 2022), with the paper's rule for head counts not a power of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**k for k in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class RelativePositionBias(nn.Module):
    """A score term b_h(j - i): ``learned`` table clipped at ``max_distance``, or ``alibi``
    ``-slope_h * |i - j|`` (``max_distance`` ignored)."""

    def __init__(self, kind: str, num_heads: int, max_distance: int) -> None:
        super().__init__()
        self.kind = require_choice("position bias: 'kind'", kind, POSITION_BIASES)
        self.num_heads = num_heads
        self.max_distance = max_distance
        if kind == "learned":
            self.table = nn.Parameter(torch.zeros(num_heads, 2 * max_distance + 1))  # (H, 2M+1)
            nn.init.trunc_normal_(self.table, std=0.02)
        else:
            self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)  # (H,)

    def score_mod(self) -> ScoreMod:
        """The bias as a score_mod closure over this module's tensors."""
        if self.kind == "learned":
            table, m = self.table, self.max_distance

            def learned_bias(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
                return score + table[h, (j - i).clamp(-m, m) + m]

            return learned_bias
        slopes = self.slopes

        def alibi_bias(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score - slopes[h] * (i - j).abs()

        return alibi_bias

    def describe(self) -> RelativeBias:
        """The bias as a declarative :class:`RelativeBias`."""
        if self.kind == "learned":
            return RelativeBias("learned", self.table, self.max_distance)
        return RelativeBias("alibi", self.slopes)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, num_heads={self.num_heads}, max_distance={self.max_distance}"
