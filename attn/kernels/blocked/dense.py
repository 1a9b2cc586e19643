"""The dense parts of the ``blocked`` kernel: global rows (``i < g``) and calls whose rows fit in one
block (decoding), one dense product over the only keys the band can reach.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attn.gqa import grouped_scores, grouped_values
from attn.kernels.base import Band
from attn.kernels.blocked.geometry import block_size
from attn.mods import ScoreMod


def dense_part(
    q: Tensor, k: Tensor, v: Tensor, i: Tensor, j: Tensor, allowed: Tensor,
    score_mod: ScoreMod | None,
) -> tuple[Tensor, Tensor]:
    """Dense softmax of ``q (B, H, n, D)`` over ``k`` at positions ``i``, ``j`` with ``allowed``:
    ``(out, lse)``; a row with no key gets 0 and -inf, with zero gradients."""
    batch, heads = q.shape[:2]
    scores = grouped_scores(q, k) / math.sqrt(q.shape[-1])  # (B, H, n, m); k may have H_kv heads
    if score_mod is not None:
        b = torch.arange(batch, device=q.device).view(batch, 1, 1, 1)
        h = torch.arange(heads, device=q.device).view(1, heads, 1, 1)
        scores = score_mod(scores, b, h, i.view(1, 1, -1, 1), j.view(1, 1, 1, -1))
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()  # (B, H, n, 1)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)  # (B, H, n, m)
    denom = weights.sum(dim=-1, keepdim=True)  # (B, H, n, 1)
    # an empty row divides its zeros by 1, not by a tiny clamp: 1 / tiny would scale the
    # row's incoming gradient past the float range, and 0 * inf is NaN in the backward
    has_key = denom > 0
    safe = torch.where(has_key, denom, torch.ones_like(denom))
    out = grouped_values(weights, v) / safe  # empty rows: 0
    lse = torch.where(has_key, row_max + safe.log(), torch.full_like(row_max, float("-inf")))
    return out, lse.squeeze(-1)


def global_rows(q_len: int, k_len: int, num_global: int) -> int:
    """How many of the (bottom-right aligned) query rows are global rows (``i < g``)."""
    return min(max(num_global - (k_len - q_len), 0), q_len) if num_global > 0 else 0


def global_row_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, q_offset: int,
                         key_mask: Tensor | None, score_mod: ScoreMod | None) -> Tensor:
    """Global rows at positions ``q_offset + row``, dense over every key: ``(B, H, n, Dv)``."""
    batch, n_rows, k_len = q.shape[0], q.shape[2], k.shape[2]
    i = torch.arange(q_offset, q_offset + n_rows, device=q.device)  # (n,)
    j = torch.arange(k_len, device=q.device)  # (Nk,)
    allowed = torch.ones(1, 1, n_rows, k_len, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed & (j.view(1, -1) <= i.view(-1, 1))
    if key_mask is not None:
        allowed = allowed & key_mask.view(batch, 1, 1, k_len)
    out, _ = dense_part(q, k, v, i, j, allowed, score_mod)
    return out


def uses_key_span(q_len: int, band: Band, block: int | None = None) -> bool:
    """True when the rows fit in one query block: one dense product beats the block loop."""
    return q_len <= (block or block_size(band.window))


def key_span_attention(q: Tensor, k: Tensor, v: Tensor, band: Band, *, causal: bool,
                       q_offset: int, key_mask: Tensor | None, score_mod: ScoreMod | None) -> Tensor:
    """A few non-global rows, dense over the keys they can reach (the band's span and the globals):
    ``(B, H, Nq, Dv)``."""
    if band.per_head:
        raise ValueError("key_span_attention: a per-head band runs through blocked_attention (one band per head group)")
    q_len, k_len = q.shape[2], k.shape[2]
    reach = band.dilation * band.window
    lo = max(q_offset - reach, 0)
    hi = min(q_offset + q_len + (0 if causal else reach), k_len)  # exclusive
    n_global = min(band.num_global, k_len)
    j = torch.arange(min(n_global, lo), device=q.device)  # global columns left of the span
    j = torch.cat([j, torch.arange(lo, max(hi, lo), device=q.device)])  # (n,) key positions
    i = torch.arange(q_offset, q_offset + q_len, device=q.device)  # (Nq,)
    offset = i.view(-1, 1) - j.view(1, -1)  # (Nq, n) = i - j
    allowed = (offset.abs() <= reach) & (offset % band.dilation == 0)
    if causal:
        allowed &= offset >= 0
    allowed |= j.view(1, -1) < band.num_global  # global columns (every row here has i >= g)
    allowed = allowed.view(1, 1, q_len, -1)
    if key_mask is not None:
        allowed = allowed & key_mask[:, j].view(key_mask.shape[0], 1, 1, -1)
    out, _ = dense_part(q, k[:, :, j], v[:, :, j], i, j, allowed, score_mod)
    return out  # (B, H, Nq, Dv)
