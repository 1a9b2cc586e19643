"""The ``blocked`` kernel: banded attention in O(N*w) time and memory, any device, autograd (docs/kernels.md).
Only the output and the input gradients are N-sized: on CPU every large allocation costs page faults."""

from attn.kernels.blocked.attention import blocked_attention
from attn.kernels.blocked.core import banded_attention
from attn.kernels.blocked.dense import global_rows, key_span_attention, uses_key_span
from attn.kernels.blocked.geometry import CHUNK_ELEMENTS, band_edges, block_size, chunk_elements
from attn.kernels.blocked.kernel import BlockedKernel

__all__ = [
    "CHUNK_ELEMENTS",
    "BlockedKernel",
    "band_edges",
    "banded_attention",
    "block_size",
    "blocked_attention",
    "chunk_elements",
    "global_rows",
    "key_span_attention",
    "uses_key_span",
]
