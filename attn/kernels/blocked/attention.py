""":func:`blocked_attention`: exact banded attention, global rows densely and band rows block by block, per run
of heads of one dilation (the kernel and the packed path call it)."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.kernels.base import Band
from attn.kernels.blocked.core import banded_attention
from attn.kernels.blocked.dense import global_row_attention, global_rows, key_span_attention, uses_key_span
from attn.mods import ScoreMod, shifted_score_mod
from attn.precision import upcast


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Band,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    score_mod: ScoreMod | None = None,
    block: int | None = None,
    chunk: int | None = None,
) -> Tensor:
    """Exact banded attention in O(N*w) time: ``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, .)`` -> ``(B, H, Nq, Dv)``,
    bottom-right aligned; ``block`` (rows per block) and ``chunk`` (blocks per chunk) override the defaults."""
    if band.per_head:
        outs = []
        for h0, h1, group in band.head_groups(q.shape[1]):
            k_heads, v_heads = _key_heads(k, q.shape[1], h0, h1), _key_heads(v, q.shape[1], h0, h1)
            outs.append(blocked_attention(
                q[:, h0:h1], k_heads, v_heads, group, causal=causal, key_mask=key_mask,
                score_mod=shifted_score_mod(score_mod, head=h0), block=block, chunk=chunk,
            ))  # (B, h1 - h0, Nq, Dv)
        return torch.cat(outs, dim=1)  # (B, H, Nq, Dv)
    compute = upcast(q.dtype)
    dtype = q.dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    q_len, k_len = q.shape[2], k.shape[2]
    offset = k_len - q_len  # position of query row 0
    n_global_rows = global_rows(q_len, k_len, band.num_global)
    band_out = None  # (B, H, Nq - n_global_rows, Dv)
    if n_global_rows < q_len:
        if not uses_key_span(q_len - n_global_rows, band, block):
            # the global rows computed inside the core, into the same output: no concatenation
            return banded_attention(q, k, v, band, causal=causal, q_offset=offset, key_mask=key_mask,
                                    score_mod=score_mod, block=block, chunk=chunk,
                                    global_rows=n_global_rows).to(dtype)
        band_out = key_span_attention(q[:, :, n_global_rows:], k, v, band, causal=causal,
                                      q_offset=offset + n_global_rows, key_mask=key_mask, score_mod=score_mod)
    if n_global_rows == 0:
        result = band_out
    else:
        global_out = global_row_attention(q[:, :, :n_global_rows], k, v, causal=causal, q_offset=offset,
                                          key_mask=key_mask, score_mod=score_mod)  # (B, H, n_global_rows, Dv)
        result = global_out if band_out is None else torch.cat([global_out, band_out], dim=2)
    return result.to(dtype)


def _key_heads(x: Tensor, heads: int, h0: int, h1: int) -> Tensor:
    """The key heads query heads ``[h0, h1)`` read, keeping the slice's grouping (a view when possible)."""
    kv_heads = x.shape[1]
    groups = heads // kv_heads
    if groups == 1:
        return x[:, h0:h1]
    if h0 // groups == (h1 - 1) // groups:  # inside one group: one key head for the slice
        return x[:, h0 // groups : h0 // groups + 1]
    if h0 % groups == 0 and h1 % groups == 0:  # whole groups
        return x[:, h0 // groups : h1 // groups]
    return x[:, torch.arange(h0, h1, device=x.device) // groups]  # (B, h1 - h0, Nk, .)
