"""Mask and score modifications, where a variant's semantics are written: ``mask_mod(b, h, i, j) -> bool`` and
``score_mod(score, b, h, i, j)``, elementwise so they run on dense grids, under ``vmap`` (flex) and per block."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def causal_mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """Causal rule: key ``j`` is visible to query ``i`` when ``j <= i``."""
    return j <= i


def and_masks(*mods: MaskMod | None) -> MaskMod | None:
    """The conjunction of the given mask_mods (``None`` entries mean "all allowed")."""
    active = [m for m in mods if m is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]

    def combined(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        out = active[0](b, h, i, j)
        for mod in active[1:]:
            out = out & mod(b, h, i, j)
        return out

    return combined


def shifted_score_mod(score_mod: ScoreMod | None, *, batch: int = 0, head: int = 0) -> ScoreMod | None:
    """``score_mod`` for a slice of a call that starts at batch row ``batch`` and head ``head``."""
    if score_mod is None or (batch == 0 and head == 0):
        return score_mod

    def shifted(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return score_mod(score, b + batch, h + head, i, j)

    return shifted


def index_grids(
    batch: int, heads: int, q_len: int, k_len: int, device: torch.device, offset: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Broadcastable grids ``b (B,1,1,1), h (1,H,1,1), i (1,1,Nq,1), j (1,1,1,Nk)``, ``i`` absolute from ``offset``
    (default ``Nk - Nq``)."""
    offset = k_len - q_len if offset is None else offset
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    i = (torch.arange(q_len, device=device) + offset).view(1, 1, q_len, 1)
    j = torch.arange(k_len, device=device).view(1, 1, 1, k_len)
    return b, h, i, j


def dense_allowed(
    mask_mod: MaskMod | None,
    *,
    batch: int,
    heads: int,
    q_len: int,
    k_len: int,
    causal: bool,
    key_mask: Tensor | None,
    device: torch.device,
    offset: int | None = None,
) -> Tensor | None:
    """Materialise the allowed-pairs mask, bool ``(B|1, H|1, Nq, Nk)``; ``None`` if all allowed."""
    mod = and_masks(mask_mod, causal_mask_mod if causal else None)
    allowed: Tensor | None = None
    if mod is not None:
        b, h, i, j = index_grids(batch, heads, q_len, k_len, device, offset)
        allowed = torch.as_tensor(mod(b, h, i, j), device=device, dtype=torch.bool)
        shape = torch.broadcast_shapes(allowed.shape, (1, 1, q_len, k_len))
        allowed = allowed.expand(shape)
    if key_mask is not None:
        km = key_mask.view(batch, 1, 1, k_len)  # (B, 1, 1, Nk)
        allowed = km if allowed is None else allowed & km
        allowed = allowed.expand(torch.broadcast_shapes(allowed.shape, (1, 1, q_len, k_len)))
    return allowed


def dense_scores_mod(score_mod: ScoreMod | None, scores: Tensor, offset: int | None = None) -> Tensor:
    """Apply ``score_mod`` to dense scores ``(B, H, Nq, Nk)`` (query positions as :func:`index_grids`)."""
    if score_mod is None:
        return scores
    batch, heads, q_len, k_len = scores.shape
    b, h, i, j = index_grids(batch, heads, q_len, k_len, scores.device, offset)
    return score_mod(scores, b, h, i, j)


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """Softmax over the last dim restricted to ``allowed``; rows with no allowed key are zeros, never NaN."""
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    row_has_key = allowed.any(dim=-1, keepdim=True)  # (.., Nq, 1)
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~row_has_key, 0.0)
    return torch.softmax(scores, dim=-1).masked_fill(~row_has_key, 0.0)
