"""Forward pass of the banded core: per stream and chunk, one softmax over the band and the global
columns, written into the output; only the output and the log-sum-exp are N-sized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attn.kernels.base import host_reads_are_free
from attn.kernels.blocked.chunk import Chunk, StreamInputs, chunk_scores
from attn.kernels.blocked.flash import flash_applies, flash_forward_chunk
from attn.kernels.blocked.geometry import Geometry, Stream, max_chunk_blocks


@dataclass(frozen=True)
class BandInputs:
    """The core's operands, saved for the backward as they are: biases additive (0 / -inf) or None,
    per-block ``score_bias (T|1, S, L)``, ``edges (S, L)`` the band's mask."""

    q: Tensor
    k: Tensor
    v: Tensor
    key_bias: Tensor | None
    global_bias: Tensor | None
    score_bias: Tensor | None
    global_score_bias: Tensor | None
    edges: Tensor

    def stream_inputs(self, stream: Stream, key_masked: Tensor | None, num_global: int) -> StreamInputs:
        """The stream's views of these inputs."""
        return StreamInputs(stream, self.q, self.k, self.v, self.key_bias, key_masked, num_global,
                            self.global_bias)

    def scores(self, chunk: Chunk, inputs: StreamInputs, buf: Tensor, scale: float, blocks: slice
               ) -> tuple[Tensor, Tensor | None]:
        """The chunk's band scores ``(c, S, L)`` (into ``buf``) and global scores ``(c*S, g)``."""
        return chunk_scores(chunk, inputs, self.edges, buf, scale, self.score_bias, self.global_score_bias,
                            blocks)


def band_forward(band: BandInputs, geo: Geometry, streams: list[Stream], num_global: int,
                 out: Tensor | None = None, lse: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
    """``out (B, H, Nq, Dv)``, the rows' log-sum-exp (-inf for no key) and the masked keys read on the
    host (None without a key bias or on an accelerator); ``out`` and ``lse`` may be given to write into."""
    q, v = band.q, band.v
    batch, heads, q_len, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    if out is None:
        out = q.new_empty(batch, heads, q_len, v.shape[-1])  # (B, H, Nq, Dv)
    if lse is None:
        lse = q.new_empty(batch, heads, q_len)  # (B, H, Nq)
    scores_buf = q.new_empty(max_chunk_blocks(geo, streams), geo.block, geo.window_keys)  # (chunk, S, L)
    # on CPU a chunk skips the key bias when its windows hold no masked key; elsewhere no host read
    key_masked = None
    if band.key_bias is not None and host_reads_are_free(band.key_bias.device):
        key_masked = torch.isneginf(band.key_bias)
    for stream in streams:
        inputs = band.stream_inputs(stream, key_masked, num_global)
        out_rows, lse_rows = stream.view(out, stream.q_rows), stream.view(lse, stream.q_rows)  # (nq, Dv), (nq,)
        for first, end, interior in stream.chunks(geo):
            chunk = Chunk(stream, geo, first, end, interior, inputs)
            if flash_applies(chunk, q, band.v, band.score_bias is not None, inputs.global_k is not None):
                flash_forward_chunk(chunk, band.edges, scale, out_rows, lse_rows)
                continue
            blocks = slice(stream.first_block + first, stream.first_block + end)
            _forward_chunk(band, chunk, inputs, blocks, scores_buf, scale, out_rows, lse_rows)
    return out, lse, key_masked


def _forward_chunk(band: BandInputs, chunk: Chunk, inputs: StreamInputs, blocks: slice, scores_buf: Tensor,
                   scale: float, out_rows: Tensor, lse_rows: Tensor) -> None:
    """Softmax attention of one chunk into the stream's output rows and log-sum-exp."""
    count, rows = chunk.blocks, chunk.block
    weights, global_weights = band.scores(chunk, inputs, scores_buf, scale, blocks)  # (c, S, L), (c*S, g)
    row_max = weights.amax(dim=-1)  # (c, S)
    if global_weights is not None:
        row_max = torch.maximum(row_max, global_weights.amax(dim=-1).view_as(row_max))
    row_max.masked_fill_(torch.isneginf(row_max), 0.0)  # a row with no key: exp(-inf - 0) = 0
    weights.sub_(row_max.unsqueeze(-1)).exp_()  # (c, S, L) unnormalised probabilities
    denom = weights.sum(dim=-1)  # (c, S)
    if chunk.interior:
        out = out_rows[chunk.row_start : chunk.row_end]  # (c*S, Dv): written in place
    else:
        out = out_rows.new_empty(count * rows, out_rows.shape[-1])  # (c*S, Dv) with padding rows
    torch.bmm(weights, chunk.v, out=out.unflatten(0, (count, rows)))  # (c, S, Dv)
    if global_weights is not None:
        global_weights.sub_(row_max.view(-1, 1)).exp_()  # (c*S, g)
        denom += global_weights.sum(dim=-1).view_as(denom)
        out.addmm_(global_weights, inputs.global_v)
    denom = denom.flatten()  # (c*S,)
    out.div_(denom.clamp_min(torch.finfo(out.dtype).tiny).unsqueeze(-1))
    row_lse = row_max.flatten().add_(denom.log())  # (c*S,), -inf where no key
    if not chunk.interior:
        valid = chunk.row_end - chunk.row_start
        out_rows[chunk.row_start : chunk.row_end] = out[:valid]
        row_lse = row_lse[:valid]
    lse_rows[chunk.row_start : chunk.row_end] = row_lse
