"""The ``blocked`` kernel: banded attention in O(N*w) time and memory, any device, autograd.

Each chunk of query blocks attends a strided view of its keys (``baddbmm``, softmax, ``bmm``; on CPU
interior chunks through torch's flash kernel); the backward recomputes scores from the log-sum-exp.
Only the output and input gradients are N-sized: on CPU every large allocation costs page faults.
Dilated bands run per residue class, per-head dilations per run of heads, global rows densely;
rows that fit in one block (decoding) take one dense product (:mod:`.dense`).
"""

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
