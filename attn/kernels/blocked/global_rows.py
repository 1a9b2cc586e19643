"""Global rows inside the banded core: the first ``n`` query rows (``i < g``) attend every key, into the core's
output and gradients (docs/kernels.md, "Global tokens in ``blocked``: what they allocate")."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attn.mods import ScoreMod, index_grids


def global_row_bias(score_mod: ScoreMod | None, rows: int, k_len: int, q_offset: int, causal: bool,
                    key_mask: Tensor | None, batch: int, heads: int, dtype: torch.dtype,
                    device: torch.device) -> Tensor | None:
    """Additive bias ``(B|1, H|1, rows, Nk)`` of the global rows: score term plus -inf where a key is not
    allowed; None when every key is allowed and there is no score_mod."""
    b, h, i, j = index_grids(batch, heads, rows, k_len, device, offset=q_offset)  # i (1, 1, rows, 1)
    bias = None
    if score_mod is not None:
        zero = torch.zeros((), dtype=dtype, device=device)
        bias = torch.as_tensor(score_mod(zero, b, h, i, j), dtype=dtype, device=device)
    allowed = None
    if causal:
        allowed = j <= i  # (1, 1, rows, Nk)
    if key_mask is not None:
        keys = key_mask.view(key_mask.shape[0], 1, 1, k_len)
        allowed = keys if allowed is None else allowed & keys
    if allowed is None:
        return None if bias is None else bias.expand(*bias.shape[:2], rows, k_len)
    base = torch.zeros((), dtype=dtype, device=device) if bias is None else bias
    return torch.where(allowed, base, torch.full((), float("-inf"), dtype=dtype, device=device))


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """``x (B|1, H|1, n, m)`` as ``(B|1, H_kv|1, G|1, n, m)``: the query heads of a key head side by side."""
    return x.unsqueeze(1) if x.shape[1] == 1 else x.unflatten(1, (kv_heads, -1))


def _scores(q_rows: Tensor, k: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """``q_rows (B, H_kv, G*n, D)`` x ``k (B, H_kv, Nk, D)`` -> scaled, biased ``(B, H_kv, G*n, Nk)``."""
    scores = torch.matmul(q_rows, k.transpose(-1, -2)).mul_(scale)  # (B, H_kv, G*n, Nk)
    if bias is not None:
        batch, kv_heads, _, k_len = scores.shape
        n = bias.shape[2]
        scores.view(batch, kv_heads, -1, n, k_len).add_(_grouped(bias, kv_heads))
    return scores


def _rows(x: Tensor, n: int, kv_heads: int) -> Tensor:
    """The first ``n`` rows of ``x (B, H, N, D)`` per key head: ``(B, H_kv, G*n, D)`` (a copy)."""
    batch, heads = x.shape[:2]
    return x[:, :, :n].reshape(batch, kv_heads, heads // kv_heads * n, x.shape[-1])


def global_rows_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, n: int,
                        out: Tensor, lse: Tensor) -> None:
    """Attention of ``q[:, :, :n]`` over every key, into ``out`` and ``lse`` (-inf for a row with no key)."""
    batch, heads = q.shape[:2]
    kv_heads = k.shape[1]
    scores = _scores(_rows(q, n, kv_heads), k, bias, 1.0 / math.sqrt(q.shape[-1]))  # (B, H_kv, G*n, Nk)
    row_max = scores.amax(dim=-1, keepdim=True)  # (B, H_kv, G*n, 1)
    row_max.masked_fill_(torch.isneginf(row_max), 0.0)
    probs = scores.sub_(row_max).exp_()  # unnormalised
    denom = probs.sum(dim=-1, keepdim=True)  # (B, H_kv, G*n, 1)
    rows_out = torch.matmul(probs, v).div_(denom.clamp_min(torch.finfo(out.dtype).tiny))  # (B, H_kv, G*n, Dv)
    out[:, :, :n] = rows_out.view(batch, heads, n, -1)
    lse[:, :, :n] = row_max.add_(denom.log()).view(batch, heads, n)


def global_rows_backward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, n: int, out: Tensor,
                         lse: Tensor, d_out: Tensor, d_q: Tensor, d_k: Tensor, d_v: Tensor,
                         want_bias: bool) -> Tensor | None:
    """Gradients of :func:`global_rows_forward`: writes ``d_q[:, :, :n]``, adds into ``d_k``, ``d_v``;
    returns the bias's gradient ``(B, H, n, Nk)`` when ``want_bias``."""
    batch, heads = q.shape[:2]
    kv_heads, k_len = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    q_rows = _rows(q, n, kv_heads)  # (B, H_kv, G*n, D)
    d_out_rows = _rows(d_out, n, kv_heads)  # (B, H_kv, G*n, Dv)
    delta = (d_out_rows * _rows(out, n, kv_heads)).sum(dim=-1, keepdim=True)  # (B, H_kv, G*n, 1)
    row_lse = _rows(lse.unsqueeze(-1), n, kv_heads)  # (B, H_kv, G*n, 1)
    row_lse = torch.where(torch.isneginf(row_lse), torch.full_like(row_lse, float("inf")), row_lse)  # no key: P = 0
    probs = _scores(q_rows, k, bias, scale).sub_(row_lse).exp_()  # P (B, H_kv, G*n, Nk)
    flat = batch * kv_heads
    d_v.view(flat, k_len, -1).baddbmm_(probs.flatten(0, 1).transpose(1, 2), d_out_rows.flatten(0, 1))
    d_scores = torch.matmul(d_out_rows, v.transpose(-1, -2)).sub_(delta).mul_(probs)  # dS (B, H_kv, G*n, Nk)
    d_q[:, :, :n] = torch.matmul(d_scores, k).mul_(scale).view(batch, heads, n, -1)
    d_k.view(flat, k_len, -1).baddbmm_(d_scores.flatten(0, 1).transpose(1, 2), q_rows.flatten(0, 1), alpha=scale)
    return d_scores.view(batch, heads, n, k_len) if want_bias else None
