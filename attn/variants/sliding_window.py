"""``sliding_window``: a band of half-width w around the query (Beltagy et al. 2020, Longformer, fig. 2b)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn.base import Band, ExactAttention
from attn.mods import MaskMod
from attn.registration import register_attention
from attn.validation import Param


def sliding_window_mod(window: int) -> MaskMod:
    """Allowed iff |i - j| <= window: at most 2w+1 keys, w+1 under causal."""

    def sliding_window(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return (i - j).abs() <= window

    return sliding_window


@register_attention("sliding_window")
class SlidingWindowAttention(ExactAttention):
    """Local (convolutional) attention: key j visible to query i iff |i - j| <= window."""

    example_params = ({"window": 0}, {"window": 3}, {"window": 5, "position_bias": "learned"})
    param_rules: ClassVar[dict[str, Param]] = {"window": Param(minimum=0)}

    def __init__(self, window: int = 128, **common) -> None:
        self.check_params(window=window)
        super().__init__(**common)
        self.window = window

    def mask_mod(self) -> MaskMod:
        return sliding_window_mod(self.window)

    def band(self) -> Band:
        return Band(window=self.window)

    def extra_repr(self) -> str:
        return f"window={self.window}, {super().extra_repr()}"
