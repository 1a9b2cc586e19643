"""``causal``: full attention with the causal rule always on (the decoder mask of Vaswani et al. 2017)."""

from __future__ import annotations

from attn.base import ExactAttention
from attn.registration import register_attention


@register_attention("causal")
class CausalAttention(ExactAttention):
    """Causal softmax attention: key j visible to query i iff j <= i, whatever ``causal`` says."""

    forces_causal = True
