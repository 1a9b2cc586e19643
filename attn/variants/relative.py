"""``relative``: full attention with a relative-position score term b_h(j - i)."""

from __future__ import annotations

from typing import Any, ClassVar

from attn.base import ExactAttention, require_num_heads
from attn.position_bias import POSITION_BIASES
from attn.registration import register_attention
from attn.validation import Param


@register_attention("relative")
class RelativeAttention(ExactAttention):
    """Full attention plus a per-head relative position bias: ``learned`` (clipped at max_distance) or ``alibi``.

    Any mask variant takes the same bias through its ``position_bias`` parameter.
    """

    example_params = ({"bias": "learned", "max_distance": 4}, {"bias": "alibi"})
    param_rules: ClassVar[dict[str, Param]] = {"bias": Param(choices=POSITION_BIASES)}

    def __init__(self, bias: str = "learned", max_distance: int = 128, **common) -> None:
        self.check_params(bias=bias, position_bias=common.pop("position_bias", None))
        super().__init__(position_bias=bias, max_distance=max_distance, **common)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        if "bias" in params:  # (the constructor passes bias on to ExactAttention as position_bias)
            if params.get("position_bias") is not None:
                raise ValueError("relative: use parameter 'bias', not 'position_bias'")
            if params["bias"] is not None:
                require_num_heads("relative", params, f"bias={params['bias']!r}",
                                  "the bias has one set of values per head")
        super().check_together(params)
