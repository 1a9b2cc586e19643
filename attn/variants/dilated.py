"""``dilated``: a window over every r-th position (fig. 12.15e/f, dilation rate 2 and 3)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn.base import Band, ExactAttention
from attn.mods import MaskMod
from attn.registration import register_attention
from attn.validation import Param


def dilated_mod(window: int, dilation: int) -> MaskMod:
    """Allowed iff (i - j) % r == 0 and |i - j| <= r * w: 2w+1 keys spaced r apart."""

    def dilated(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        offset = i - j
        return (offset.remainder(dilation) == 0) & (offset.abs() <= dilation * window)

    return dilated


@register_attention("dilated")
class DilatedAttention(ExactAttention):
    """Dilated sliding window: key j visible to i iff (i-j) % dilation == 0 and |i-j| <= dilation*window."""

    kernels: ClassVar[tuple[str, ...]] = ("reference", "sdpa", "blocked", "chunked", "flex")
    example_params = ({"window": 2, "dilation": 2}, {"window": 1, "dilation": 3}, {"window": 0, "dilation": 4})
    param_rules: ClassVar[dict[str, Param]] = {"window": Param(minimum=0), "dilation": Param(minimum=1)}

    def __init__(self, window: int = 64, dilation: int = 2, **common) -> None:
        self.check_params(window=window, dilation=dilation)
        super().__init__(**common)
        self.window = window
        self.dilation = dilation

    def mask_mod(self) -> MaskMod:
        return dilated_mod(self.window, self.dilation)

    def band(self) -> Band:
        return Band(window=self.window, dilation=self.dilation)

    def extra_repr(self) -> str:
        return f"window={self.window}, dilation={self.dilation}, {super().extra_repr()}"
