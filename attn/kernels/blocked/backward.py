"""Backward pass of the banded core: probabilities recomputed per chunk from the saved log-sum-exp,
so no ``N x L`` tensor is kept. ``dV = P^T dO``, ``dS = P * (dO V^T - delta)``, ``dQ = scale * dS K``,
``dK = scale * dS^T Q``, summed into the key rows the windows cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attn.kernels.blocked.chunk import Chunk, StreamInputs
from attn.kernels.blocked.flash import flash_applies, flash_backward_chunk
from attn.kernels.blocked.forward import BandInputs
from attn.kernels.blocked.geometry import Geometry, Stream, max_chunk_blocks


@dataclass(frozen=True)
class BandGrads:
    """Gradients of the core's inputs (``k``, ``v`` summed over overlapping windows and a key head's
    query heads), and of the per-block biases or None when not wanted."""

    q: Tensor
    k: Tensor
    v: Tensor
    score_bias: Tensor | None
    global_score_bias: Tensor | None


@dataclass(frozen=True)
class _Buffers:
    """Per-chunk work space, reused by every chunk."""

    probs: Tensor
    d_scores: Tensor
    d_k: Tensor
    d_v: Tensor


@dataclass(frozen=True)
class _StreamRows:
    """One stream's views of the per-row tensors and of the key gradients."""

    d_out: Tensor
    delta: Tensor
    lse: Tensor
    d_q: Tensor
    out: Tensor
    d_k: Tensor
    d_v: Tensor


def band_backward(band: BandInputs, out: Tensor, lse: Tensor, key_masked: Tensor | None, d_out: Tensor,
                  geo: Geometry, streams: list[Stream], num_global: int, want_bias: bool,
                  want_global_bias: bool, d_q: Tensor | None = None) -> BandGrads:
    """Gradients of :func:`attn.kernels.blocked.forward.band_forward` for ``d_out (B, H, Nq, Dv)``;
    the query gradients go into ``d_q`` when given (a view into the caller's gradient)."""
    q, k, v = band.q, band.k, band.v
    scale = 1.0 / math.sqrt(q.shape[-1])
    if d_out.stride(-1) != 1 or d_out.stride(-2) != d_out.shape[-1]:
        d_out = d_out.contiguous()
    delta = (d_out * out).sum(dim=-1)  # (B, H, Nq)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)  # no key: P = 0
    n_blocks = sum(stream.n_blocks(geo.block) for stream in streams)
    grads = BandGrads(
        q=torch.empty(q.shape, dtype=q.dtype, device=q.device) if d_q is None else d_q,
        k=torch.zeros(k.shape, dtype=k.dtype, device=k.device),
        v=torch.zeros(v.shape, dtype=v.dtype, device=v.device),
        score_bias=q.new_empty(n_blocks, geo.block, geo.window_keys) if want_bias else None,
        global_score_bias=q.new_empty(n_blocks, geo.block, num_global) if want_global_bias else None,
    )
    chunk_blocks = max_chunk_blocks(geo, streams)
    probs = q.new_empty(chunk_blocks, geo.block, geo.window_keys)
    buffers = _Buffers(probs, torch.empty_like(probs), q.new_empty(chunk_blocks, geo.window_keys, q.shape[-1]),
                       q.new_empty(chunk_blocks, geo.window_keys, v.shape[-1]))
    for stream in streams:
        inputs = band.stream_inputs(stream, key_masked, num_global)
        rows = _StreamRows(*(stream.view(x, stream.q_rows) for x in (d_out, delta, lse, grads.q, out)),
                           stream.kv_view(grads.k, stream.k_rows), stream.kv_view(grads.v, stream.k_rows))
        for first, end, interior in stream.chunks(geo):
            chunk = Chunk(stream, geo, first, end, interior, inputs)
            if flash_applies(chunk, q, band.v, band.score_bias is not None, inputs.global_k is not None):
                _flash_backward(chunk, band.edges, scale, rows, geo)
                continue
            blocks = slice(stream.first_block + first, stream.first_block + end)
            _backward_chunk(band, chunk, inputs, blocks, buffers, scale, rows, grads, stream, geo)
    return grads


def _backward_chunk(band: BandInputs, chunk: Chunk, inputs: StreamInputs, blocks: slice, buffers: _Buffers,
                    scale: float, rows: _StreamRows, grads: BandGrads, stream: Stream, geo: Geometry) -> None:
    """One chunk's contribution to every gradient."""
    count, block = chunk.blocks, chunk.block
    probs, global_probs = band.scores(chunk, inputs, buffers.probs, scale, blocks)  # scores, for now
    lse = chunk.rows(rows.lse, float("inf")).view(count, block, 1)  # padding rows: P = 0
    probs.sub_(lse).exp_()  # (c, S, L)
    d_out = chunk.rows(rows.d_out)  # (c*S, Dv), zero on padding rows
    d_out_blocks = d_out.unflatten(0, (count, block))  # (c, S, Dv)
    delta = chunk.rows(rows.delta).view(count, block, 1)
    d_v_windows = torch.bmm(probs.transpose(1, 2), d_out_blocks, out=buffers.d_v[:count])  # (c, L, Dv)
    d_scores = torch.bmm(d_out_blocks, chunk.v.transpose(1, 2), out=buffers.d_scores[:count])  # dP (c, S, L)
    d_scores.sub_(delta).mul_(probs)  # dS = P * (dP - delta)
    if grads.score_bias is not None:
        grads.score_bias[blocks] = d_scores
    if chunk.interior:
        d_q = rows.d_q[chunk.row_start : chunk.row_end]  # (c*S, D): written in place
    else:
        d_q = band.q.new_empty(count * block, band.q.shape[-1])  # (c*S, D) with padding rows
    torch.bmm(d_scores, chunk.k, out=d_q.unflatten(0, (count, block))).mul_(scale)  # (c, S, D)
    d_k_windows = buffers.d_k[:count].baddbmm_(d_scores.transpose(1, 2), chunk.q.unflatten(0, (count, block)),
                                               beta=0.0, alpha=scale)  # (c, L, D)
    if global_probs is not None:
        _backward_global_columns(chunk, inputs, blocks, global_probs, lse, d_out, delta, d_q, scale, grads,
                                 stream)
    if not chunk.interior:
        rows.d_q[chunk.row_start : chunk.row_end] = d_q[: chunk.row_end - chunk.row_start]
    chunk.scatter_keys(rows.d_k, d_k_windows, geo)
    chunk.scatter_keys(rows.d_v, d_v_windows, geo)


def _flash_backward(chunk: Chunk, edges: Tensor, scale: float, rows: _StreamRows, geo: Geometry) -> None:
    """An interior chunk's gradients through the flash kernel's backward."""
    span = slice(chunk.row_start, chunk.row_end)
    d_k_windows, d_v_windows = flash_backward_chunk(chunk, edges, scale, rows.d_out[span], rows.out[span],
                                                    rows.lse[span], rows.d_q[span])
    chunk.scatter_keys(rows.d_k, d_k_windows, geo)
    chunk.scatter_keys(rows.d_v, d_v_windows, geo)


def _backward_global_columns(chunk: Chunk, inputs: StreamInputs, blocks: slice, global_probs: Tensor,
                             lse: Tensor, d_out: Tensor, delta: Tensor, d_q: Tensor, scale: float,
                             grads: BandGrads, stream: Stream) -> None:
    """The global columns' part: adds into ``d_q`` and the global keys' rows of ``grads.k``, ``grads.v``."""
    count, block = chunk.blocks, chunk.block
    num_global = global_probs.shape[-1]
    global_probs.sub_(lse.view(-1, 1)).exp_()  # (c*S, g)
    d_global = torch.mm(d_out, inputs.global_v.t()).sub_(delta.view(-1, 1)).mul_(global_probs)  # dS (c*S, g)
    if grads.global_score_bias is not None:
        grads.global_score_bias[blocks] = d_global.view(count, block, -1)
    d_q.addmm_(d_global, inputs.global_k, alpha=scale)
    grads.k[stream.batch, stream.key_head, :num_global].addmm_(d_global.t(), chunk.q, alpha=scale)
    grads.v[stream.batch, stream.key_head, :num_global].addmm_(global_probs.t(), d_out)
