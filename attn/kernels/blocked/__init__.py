"""The ``blocked`` kernel: banded attention in O(N*w) time and memory, any device, autograd.

Queries are cut into blocks of ``S`` rows; block ``t`` attends to the ``L = nw * S`` keys
around it (``blocks_left`` blocks to the left, ``blocks_right`` to the right). The work is
done per *stream* (one batch element, head and, for dilated patterns, residue class) on
plain 2-D views of the caller's tensors: the key windows of a run of blocks are one strided
view (``as_strided``, no copy), so each chunk of blocks is one ``baddbmm`` for the scores
(scale and band edges fused in), one softmax and one ``bmm`` for the output, written
straight into the output; on CPU, an interior chunk whose scores are ``q . k`` and the band
alone goes through torch's flash kernel instead (:mod:`attn.kernels.blocked.flash`). Only the
blocks at the ends of a stream, whose window leaves ``[0, Nk)``, go through small zero-padded
copies. The backward pass recomputes the scores
from the saved log-sum-exp (as flash attention does). No ``N x N``, no ``N x L`` tensor and
no padded copy of the inputs is made, forward or backward: on CPU every large allocation
costs page faults, so the kernel allocates the output (and the three input gradients) and
nothing else of size ``N``.

Patterns (:class:`attn.Band`):

* sliding window ``|i - j| <= w``: the band itself;
* dilated ``(i - j) % r == 0 and |i - j| <= r*w``: each residue class ``c`` of positions
  (rows ``c::r``, a strided view) is a plain window ``w`` over its own keys; per-head
  dilations (``Band.group_dilations``) run each run of heads of one rate as its own band
  (views of those heads) and concatenate along H, still O(N*w);
* global tokens ``i < g or j < g or band``: rows ``i < g`` are dense (O(g*N)); the other rows
  take the band (keys ``j < g`` removed from it) and the ``g`` global columns in one softmax.

A position bias (score_mod) is evaluated on the computed blocks only (O(N*L)) and receives
gradients. Rows with no allowed key give zeros, forward and backward. Rows that fit in one
block (KV-cache decoding) skip the stream loop: one dense product over the keys the band can
reach (:func:`~attn.kernels.blocked.dense.key_span_attention`).

Modules, by concern:

* :mod:`~attn.kernels.blocked.geometry`: block size, band edges, the block layout, streams;
* :mod:`~attn.kernels.blocked.chunk`: a chunk's operands (views or padded copies), its scores;
* :mod:`~attn.kernels.blocked.forward` / :mod:`~attn.kernels.blocked.backward`: the passes;
* :mod:`~attn.kernels.blocked.core`: the autograd function and :func:`banded_attention`;
* :mod:`~attn.kernels.blocked.global_rows`: the global rows (``i < g``, dense over every key)
  inside the core, written into its output and added into its key gradients in place;
* :mod:`~attn.kernels.blocked.dense`: the one-block (decoding) path, and global rows beside it;
* :mod:`~attn.kernels.blocked.attention`: :func:`blocked_attention` (the kernel and the packed path);
* :mod:`~attn.kernels.blocked.kernel`: :class:`BlockedKernel`.
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
