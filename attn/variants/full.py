"""``full``: every query attends to every key (Vaswani et al. 2017); causal adds j <= i."""

from __future__ import annotations

from attn.base import ExactAttention
from attn.registration import register_attention


@register_attention("full")
class FullAttention(ExactAttention):
    """Full softmax attention: all keys allowed; ``causal=True`` keeps j <= i."""

    example_params = ({}, {"position_bias": "alibi"})
