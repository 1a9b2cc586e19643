"""``global_tokens``: a sliding window plus g global positions (Longformer fig. 2d; BigBird, Zaheer et al. 2020)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn.base import Band, ExactAttention
from attn.mods import MaskMod
from attn.registration import register_attention
from attn.validation import Param


def global_tokens_mod(num_global: int, window: int) -> MaskMod:
    """Allowed iff i < g or j < g or |i - j| <= w: the first g positions see and are seen by all."""

    def global_tokens(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return (i < num_global) | (j < num_global) | ((i - j).abs() <= window)

    return global_tokens


@register_attention("global_tokens")
class GlobalTokensAttention(ExactAttention):
    """Global + local attention: positions < num_global attend and are attended everywhere; others use a window.

    "Selected" global tokens (e.g. CLS at 0) and "extra" prepended ones both use this pattern."""

    example_params = ({"num_global": 1, "window": 2}, {"num_global": 3, "window": 0}, {"num_global": 0, "window": 4})
    param_rules: ClassVar[dict[str, Param]] = {"num_global": Param(minimum=0), "window": Param(minimum=0)}

    def __init__(self, num_global: int = 1, window: int = 128, **common) -> None:
        self.check_params(num_global=num_global, window=window)
        super().__init__(**common)
        self.num_global = num_global
        self.window = window

    def mask_mod(self) -> MaskMod:
        return global_tokens_mod(self.num_global, self.window)

    def band(self) -> Band:
        return Band(window=self.window, num_global=self.num_global)

    def extra_repr(self) -> str:
        return f"num_global={self.num_global}, window={self.window}, {super().extra_repr()}"
