"""``relative``: full attention with a relative-position score term b_h(j - i)."""

from __future__ import annotations

from typing import ClassVar

from attn.base import ExactAttention
from attn.position_bias import POSITION_BIASES
from attn.registration import register_attention


@register_attention("relative")
class RelativeAttention(ExactAttention):
    """Full attention plus a per-head relative position bias: ``learned`` (clipped at max_distance) or ``alibi``.

    Any mask variant takes the same bias through its ``position_bias`` parameter.
    """

    kernels: ClassVar[tuple[str, ...]] = ("reference", "sdpa", "chunked", "flex")
    example_params = ({"bias": "learned", "max_distance": 4}, {"bias": "alibi"})

    def __init__(self, bias: str = "learned", max_distance: int = 128, **common) -> None:
        if bias not in POSITION_BIASES:
            raise ValueError(
                f"relative: parameter 'bias' must be one of {', '.join(map(repr, POSITION_BIASES))}; "
                f"got {bias!r}"
            )
        if common.get("position_bias") is not None:
            raise ValueError("relative: use parameter 'bias', not 'position_bias'")
        common.pop("position_bias", None)
        super().__init__(position_bias=bias, max_distance=max_distance, **common)
