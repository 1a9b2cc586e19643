"""``dilated``: a window over every r-th position (Beltagy et al. 2020, Longformer, fig. 2c)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from attn.base import Band, ExactAttention, require_num_heads
from attn.mods import MaskMod
from attn.registration import register_attention
from attn.validation import ErrorFactory, Param, invalid, require_int, require_int_list

Dilation = int | tuple[int, ...]


def head_rates(h: Tensor, rates: Sequence[int], num_heads: int) -> Tensor:
    """The rate of head ``h`` as elementwise selects, so the mask closes over no tensor."""
    size = num_heads // len(rates)
    rate = torch.full_like(h, rates[0])
    for g in range(1, len(rates)):
        if rates[g] != rates[g - 1]:
            rate = torch.where(h >= g * size, rates[g], rate)
    return rate


def dilated_mod(window: int, dilation: Dilation, num_heads: int | None = None) -> MaskMod:
    """Allowed iff (i - j) % r == 0 and |i - j| <= r * w; a tuple of k rates: head h uses
    ``dilation[h // (num_heads // k)]``."""
    if isinstance(dilation, Sequence):
        rates = tuple(dilation)
        if len(set(rates)) > 1:
            if num_heads is None or num_heads % len(rates):
                raise ValueError(
                    f"dilated_mod: per-head dilation={rates} needs num_heads divisible by {len(rates)}; "
                    f"got {num_heads}"
                )

            def dilated_per_head(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
                offset = i - j
                rate = head_rates(h, rates, num_heads)  # (1|., H|., 1|., 1|.)
                return (offset.remainder(rate) == 0) & (offset.abs() <= rate * window)

            return dilated_per_head
        dilation = rates[0]

    def dilated(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        offset = i - j
        return (offset.remainder(dilation) == 0) & (offset.abs() <= dilation * window)

    return dilated


class DilationParam(Param):
    """``dilation``: an integer >= 1 (every head), or a non-empty list of them (one per head group)."""

    def check(self, subject: str, value: Any, error: ErrorFactory = ValueError) -> Any:
        if isinstance(value, (list, tuple)):
            return require_int_list(subject, value, minimum=1, error=error)
        return require_int(subject, value, minimum=1, error=error)


@register_attention("dilated")
class DilatedAttention(ExactAttention):
    """Dilated sliding window: key j visible to i iff (i-j) % r == 0 and |i-j| <= r*window; r = dilation, one int for
    every head or one per head group (dilation=(r_0, ..., r_{k-1}): head h uses r_{h // (H/k)}; needs num_heads).

    E.g. ``(1, 2)`` with 4 heads: heads 0-1 undilated, 2-3 dilation 2 (Longformer's mix)."""

    example_params = (
        {"window": 2, "dilation": 2}, {"window": 1, "dilation": 3}, {"window": 0, "dilation": 4},
        {"window": 2, "dilation": (1, 2)},
    )
    param_rules: ClassVar[dict[str, Param]] = {"window": Param(minimum=0), "dilation": DilationParam(minimum=1)}

    def __init__(self, window: int = 64, dilation: int | Sequence[int] = 2, **common) -> None:
        self.check_params(window=window, dilation=dilation, num_heads=common.get("num_heads"))
        super().__init__(**common)
        self.window = window
        #: an int, or a tuple of ints (one per head group; a YAML list becomes a tuple)
        self.dilation: Dilation = tuple(int(r) for r in dilation) if isinstance(dilation, (list, tuple)) else dilation

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        dilation = params.get("dilation")
        if isinstance(dilation, (list, tuple)) and "num_heads" in params:
            heads, groups = params["num_heads"], len(dilation)
            shown = tuple(dilation)
            require_num_heads(cls.name, params, f"dilation={shown}",
                              "parameter 'dilation' gives one rate per head group")
            if heads % groups:
                raise invalid(
                    f"{cls.name}: parameter 'num_heads'",
                    f"must be divisible by the {groups} head groups of parameter 'dilation' "
                    f"(dilation={shown}: one rate per group); got {heads}",
                )
        super().check_together(params)

    def _rates(self) -> tuple[int, ...]:
        """The distinct-per-group rates, or a 1-tuple when every head shares one."""
        rates = self.dilation if isinstance(self.dilation, tuple) else (self.dilation,)
        return rates if len(set(rates)) > 1 else rates[:1]

    def mask_depends_on_head(self) -> bool:
        return len(self._rates()) > 1

    def mask_mod(self) -> MaskMod:
        rates = self._rates()
        if len(rates) == 1:
            return dilated_mod(self.window, rates[0])
        return dilated_mod(self.window, rates, self.num_heads)

    def band(self) -> Band:
        return Band.per_head_groups(self.window, self._rates())

    def extra_repr(self) -> str:
        return f"window={self.window}, dilation={self.dilation}, {super().extra_repr()}"
