"""Built-in attention variants, one per module; importing this package registers them."""

from attn.variants.causal import CausalAttention
from attn.variants.dilated import DilatedAttention
from attn.variants.factorised import FactorisedAttention
from attn.variants.full import FullAttention
from attn.variants.global_tokens import GlobalTokensAttention
from attn.variants.nystrom import NystromAttention
from attn.variants.relative import RelativeAttention
from attn.variants.sliding_window import SlidingWindowAttention

__all__ = [
    "CausalAttention",
    "DilatedAttention",
    "FactorisedAttention",
    "FullAttention",
    "GlobalTokensAttention",
    "NystromAttention",
    "RelativeAttention",
    "SlidingWindowAttention",
]
