"""The banded core as an autograd function, and its entry point :func:`banded_attention`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attn.kernels.base import Band
from attn.kernels.blocked.backward import band_backward
from attn.kernels.blocked.forward import BandInputs, band_forward
from attn.kernels.blocked.geometry import Geometry, Stream, band_edges, geometry, make_streams
from attn.kernels.blocked.global_rows import global_row_bias, global_rows_backward, global_rows_forward
from attn.mods import ScoreMod
from attn.precision import without_autocast


class BandCore(torch.autograd.Function):
    """Band (+ global columns) attention over all streams, and the global rows, in one autograd node.

    ``q (B, H, n + Nb, D)``: the first ``n`` rows are global rows (dense over every key), the rest
    the streams cover. Returns ``out (B, H, n + Nb, Dv)``, written in place by both parts."""

    @staticmethod
    @without_autocast
    def forward(ctx: Any, q, k, v, key_bias, global_bias, score_bias, global_score_bias, row_bias, edges,
                geo: Geometry, streams: list[Stream], num_global: int, n_rows: int):
        batch, heads, q_len, _ = q.shape
        out = q.new_empty(batch, heads, q_len, v.shape[-1])  # (B, H, Nq, Dv)
        lse = q.new_empty(batch, heads, q_len)  # (B, H, Nq)
        band = BandInputs(q[:, :, n_rows:], k, v, key_bias, global_bias, score_bias, global_score_bias, edges)
        _, _, key_masked = band_forward(band, geo, streams, num_global, out[:, :, n_rows:], lse[:, :, n_rows:])
        if n_rows:
            global_rows_forward(q, k, v, row_bias, n_rows, out, lse)
        ctx.save_for_backward(q, k, v, key_bias, global_bias, score_bias, global_score_bias, row_bias, edges,
                              out, lse)
        ctx.geo, ctx.streams, ctx.num_global, ctx.key_masked = geo, streams, num_global, key_masked
        ctx.n_rows = n_rows
        return out

    @staticmethod
    @without_autocast
    def backward(ctx: Any, d_out):
        q, k, v, key_bias, global_bias, score_bias, global_score_bias, row_bias, edges, out, lse = ctx.saved_tensors
        n = ctx.n_rows
        band = BandInputs(q[:, :, n:], k, v, key_bias, global_bias, score_bias, global_score_bias, edges)
        d_out = d_out.contiguous()
        d_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H, Nq, D)
        grads = band_backward(
            band, out[:, :, n:], lse[:, :, n:], ctx.key_masked, d_out[:, :, n:], ctx.geo, ctx.streams,
            ctx.num_global, want_bias=score_bias is not None and ctx.needs_input_grad[5],
            want_global_bias=global_score_bias is not None and ctx.needs_input_grad[6], d_q=d_q[:, :, n:],
        )
        d_row_bias = None
        if n:
            d_row_bias = global_rows_backward(q, k, v, row_bias, n, out, lse, d_out, d_q, grads.k, grads.v,
                                              want_bias=row_bias is not None and ctx.needs_input_grad[7])
        return (d_q, grads.k, grads.v, None, None, _summed(grads.score_bias, score_bias),
                _summed(grads.global_score_bias, global_score_bias), _summed(d_row_bias, row_bias),
                None, None, None, None, None)


def _summed(grad: Tensor | None, like: Tensor | None) -> Tensor | None:
    """``grad`` reduced to the shape of the (broadcast) input ``like`` it is the gradient of."""
    if grad is None or like is None or grad.shape == like.shape:
        return grad
    return grad.sum_to_size(like.shape)


def score_biases(score_mod: ScoreMod, streams: list[Stream], geo: Geometry, dilation: int,
                 num_global: int, dtype: torch.dtype, device: torch.device
                 ) -> tuple[Tensor, Tensor | None]:
    """A score_mod evaluated on every computed block: ``(T, S, L)`` and ``(T, S, g)`` or None."""
    rows, r = geo.block, dilation
    per_stream = [(stream, torch.arange(stream.n_blocks(rows), device=device)) for stream in streams]
    block_pos = torch.cat([r * (stream.q_offset + t * rows) + stream.residue for stream, t in per_stream])  # (T,)
    b = torch.cat([torch.full_like(t, stream.batch) for stream, t in per_stream]).view(-1, 1, 1)  # (T, 1, 1)
    h = torch.cat([torch.full_like(t, stream.head) for stream, t in per_stream]).view(-1, 1, 1)  # (T, 1, 1)
    i = block_pos.view(-1, 1, 1) + r * torch.arange(rows, device=device).view(1, rows, 1)  # (T, S, 1)
    cols = r * (torch.arange(geo.window_keys, device=device) - geo.blocks_left * rows)  # (L,)
    j = block_pos.view(-1, 1, 1) + cols.view(1, 1, -1)  # (T, 1, L)
    zero = torch.zeros((), dtype=dtype, device=device)
    band = score_mod(zero, b, h, i, j).to(dtype).expand(len(block_pos), rows, geo.window_keys)
    if not num_global:
        return band, None
    j_global = torch.arange(num_global, device=device).view(1, 1, -1)  # (1, 1, g)
    return band, score_mod(zero, b, h, i, j_global).to(dtype).expand(len(block_pos), rows, num_global)


def _key_biases(q: Tensor, k_len: int, num_global: int, key_mask: Tensor | None
                ) -> tuple[Tensor | None, Tensor | None]:
    """Additive ``key_bias (B|1, 1, Nk)`` for the band (padding, global keys out) and ``global_bias (B, g)``."""
    batch = q.shape[0]
    key_bias = None
    if key_mask is not None or num_global > 0:
        valid = torch.ones(1, 1, k_len, dtype=torch.bool, device=q.device)
        if key_mask is not None:
            valid = valid & key_mask.view(batch, 1, k_len)
        if num_global > 0:
            valid = valid & (torch.arange(k_len, device=q.device) >= num_global)
        key_bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device)
        key_bias.masked_fill_(~valid, float("-inf"))
    global_keys = min(num_global, k_len)
    global_bias = None
    if global_keys and key_mask is not None:
        global_bias = torch.zeros(batch, global_keys, dtype=q.dtype, device=q.device)
        global_bias.masked_fill_(~key_mask[:, :global_keys], float("-inf"))
    return key_bias, global_bias


def banded_attention(q: Tensor, k: Tensor, v: Tensor, band: Band, *, causal: bool, q_offset: int,
                     key_mask: Tensor | None, score_mod: ScoreMod | None, block: int | None,
                     chunk: int | None, global_rows: int = 0) -> Tensor:
    """Rows of ``q (B, H, Nq, D)`` at positions ``q_offset + row`` over ``k, v (B, H_kv, Nk, .)``:
    the first ``global_rows`` rows dense over every key, the others the band plus the global columns.
    Returns ``(B, H, Nq, Dv)``."""
    if band.per_head:
        raise ValueError("banded_attention: a per-head band runs through blocked_attention (one band per head group)")
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    geo = geometry(band.window, causal, block, chunk, q.device)
    key_bias, global_bias = _key_biases(q, k_len, band.num_global, key_mask)
    global_keys = min(band.num_global, k_len)
    streams = make_streams(batch, heads, q_len - global_rows, k_len, q_offset + global_rows, band.dilation,
                           geo.block, groups=heads // k.shape[1])  # GQA: a group's streams share key rows
    edges = band_edges(geo.block, geo.blocks_left, geo.blocks_right, band.window, causal, q.dtype, q.device)
    score_bias = global_score_bias = None
    if score_mod is not None:
        score_bias, global_score_bias = score_biases(score_mod, streams, geo, band.dilation, global_keys,
                                                     q.dtype, q.device)
    row_bias = None
    if global_rows:
        row_bias = global_row_bias(score_mod, global_rows, k_len, q_offset, causal, key_mask, batch, heads,
                                   q.dtype, q.device)  # (B|1, H|1, n, Nk) or None
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return BandCore.apply(q, k, v, key_bias, global_bias, score_bias, global_score_bias, row_bias, edges,
                          geo, streams, global_keys, global_rows)
