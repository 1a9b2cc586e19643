"""Grouped-query attention (GQA, Ainslie et al. 2023; MQA, Shazeer 2019): ``k, v (B, H_kv, Nk, .)`` against
``q (B, H, Nq, D)``; the helpers the kernels share (docs/contract.md, "What a kernel is given")."""

from __future__ import annotations

from torch import Tensor


def kv_groups(heads: int, kv_heads: int) -> int:
    """Query heads per key/value head, ``G = H / H_kv`` (callers have checked divisibility)."""
    return heads // kv_heads


def fold_queries(x: Tensor, kv_heads: int) -> Tensor:
    """``x (B, H, N, E) -> (B, H_kv, G*N, E)``: a group's rows stacked (a copy only of a non-contiguous ``x``)."""
    batch, heads, n, e = x.shape
    return x.reshape(batch, kv_heads, kv_groups(heads, kv_heads) * n, e)


def unfold_heads(x: Tensor, heads: int) -> Tensor:
    """``x (B, H_kv, G*N, E) -> (B, H, N, E)``, the inverse of :func:`fold_queries` (a view)."""
    batch, kv_heads, rows, e = x.shape
    return x.view(batch, heads, rows // kv_groups(heads, kv_heads), e)


def grouped_scores(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T -> (B, H, Nq, Nk)``, unscaled, each key head read once by its group (no copy of ``k``)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads == kv_heads:
        return q @ k.transpose(-1, -2)  # (B, H, Nq, Nk)
    scores = fold_queries(q, kv_heads) @ k.transpose(-1, -2)  # (B, H_kv, G*Nq, Nk)
    return unfold_heads(scores, heads)  # (B, H, Nq, Nk)


def grouped_values(probs: Tensor, v: Tensor) -> Tensor:
    """``probs (B, H, Nq, Nk) @ v (B, H_kv, Nk, Dv) -> (B, H, Nq, Dv)``, no copy of ``v``."""
    heads, kv_heads = probs.shape[1], v.shape[1]
    if heads == kv_heads:
        return probs @ v  # (B, H, Nq, Dv)
    return unfold_heads(fold_queries(probs, kv_heads) @ v, heads)  # (B, H, Nq, Dv)


def expand_kv(x: Tensor, heads: int) -> Tensor:
    """``x (B, H_kv, N, E) -> (B, H, N, E)``: a view when ``H_kv`` is 1 or ``H``, else a copy (no strided view
    repeats each head)."""
    batch, kv_heads, n, e = x.shape
    if kv_heads == heads:
        return x
    if kv_heads == 1:
        return x.expand(batch, heads, n, e)
    return x.repeat_interleave(kv_groups(heads, kv_heads), dim=1)


def gqa_note(heads: int, kv_heads: int, how: str) -> str:
    """The path suffix for a GQA call, e.g. ``", GQA 16/2 heads: grouped ..."``; ``""`` when ``H_kv == H``."""
    if heads == kv_heads:
        return ""
    kind = "MQA" if kv_heads == 1 else "GQA"
    return f", {kind} {heads}/{kv_heads} heads: {how}"


def expand_how(heads: int, kv_heads: int) -> str:
    """How :func:`expand_kv` repeats the key heads, for :func:`gqa_note`."""
    if kv_heads in (1, heads):  # a view
        return "k/v expanded to H heads (a view, no copy)"
    return "k/v repeated to H heads (a copy)"


#: how the grouped helpers run it, for :func:`gqa_note`
GROUPED = "grouped (q folded per key head, keys read once)"
