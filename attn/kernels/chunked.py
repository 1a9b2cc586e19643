"""The ``chunked`` kernel: exact attention for any mask_mod / score_mod in O(chunk * Nk) memory, each chunk of
query rows dense and checkpointed (the backward recomputes it), time still O(Nq * Nk)."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attn.gqa import GROUPED, gqa_note, grouped_scores, grouped_values
from attn.kernels.base import Kernel, KernelPath
from attn.mods import MaskMod, ScoreMod, and_masks, causal_mask_mod, dense_allowed, dense_scores_mod, masked_softmax
from attn.pattern import Pattern
from attn.precision import upcast, without_autocast

#: elements of one chunk of scores: CPU 16 MB fp32; CUDA 256 MB, a few launches, not thousands (unmeasured)
CHUNK_ELEMENTS: dict[str, int] = {"cpu": 1 << 22, "cuda": 1 << 26}


def chunk_rows(batch: int, heads: int, k_len: int, device: torch.device | str = "cpu") -> int:
    """Query rows per chunk so one chunk of scores holds about ``CHUNK_ELEMENTS`` values."""
    elements = CHUNK_ELEMENTS.get(torch.device(device).type, CHUNK_ELEMENTS["cpu"])
    return max(16, elements // max(batch * heads * k_len, 1))


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, row0: int, offset: int,
    mask_mod: MaskMod | None, score_mod: ScoreMod | None, score_params: tuple[Tensor, ...],
) -> Tensor:
    """Dense attention of the query rows ``q (B, H, C, D)`` starting at row ``row0``."""
    del score_params  # inputs only so that checkpoint tracks their gradients
    batch, heads, rows, dim = q.shape
    start = row0 + offset  # the absolute position of the chunk's first row
    scores = grouped_scores(q, k) / math.sqrt(dim)  # (B, H, C, Nk); k (B, H_kv, Nk, D) read once per group
    scores = dense_scores_mod(score_mod, scores, start)
    allowed = dense_allowed(mask_mod, batch=batch, heads=heads, q_len=rows, k_len=k.shape[2], causal=False,
                            key_mask=key_mask, device=q.device, offset=start)  # (B|1, H|1, C, Nk) | None
    return grouped_values(masked_softmax(scores, allowed), v)  # (B, H, C, Dv)


@without_autocast
def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    score_params: tuple[Tensor, ...] = (),
    causal: bool = False,
    key_mask: Tensor | None = None,
    rows: int | None = None,
    q_offset: int | None = None,
) -> Tensor:
    """Exact attention ``q (B, H, Nq, D)`` x ``k, v (B, H_kv, Nk, .)`` -> ``(B, H, Nq, Dv)``.

    ``score_params``: the tensors the score_mod closes over, so checkpointed chunks pass their
    gradients. ``q_offset``: absolute position of query row 0 (default ``Nk - Nq``)."""
    compute = upcast(q.dtype)
    dtype = q.dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    mod = and_masks(mask_mod, causal_mask_mod if causal else None)
    rows = rows or chunk_rows(batch, heads, k_len, q.device)
    offset = k_len - q_len if q_offset is None else q_offset
    grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
        or any(p.requires_grad for p in score_params)
    )
    outs = []
    for r0 in range(0, q_len, rows):
        qc = q[:, :, r0 : r0 + rows]
        args = (qc, k, v, key_mask, r0, offset, mod, score_mod, score_params)
        if grad and q_len > rows:
            outs.append(checkpoint(_chunk, *args, use_reentrant=False))
        else:
            outs.append(_chunk(*args))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.to(dtype)


class ChunkedKernel(Kernel):
    """Query chunks of dense attention, checkpointed: any exact variant, O(C*N) memory."""

    name = "chunked"
    supports_document_ids = True  # the packed mods (attn.documents) per query chunk
    computes_half_in_float32 = True
    description = "dense attention over query chunks with per-chunk checkpointing, O(chunk*N) memory"
    CUDA_MAX_KEYS = 65_536  # a Python loop of small launches, O(N^2) work

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        out = chunked_attention(
            q, k, v, mask_mod=pattern.mask_mod, score_mod=pattern.score_mod,
            score_params=pattern.score_params, causal=causal, key_mask=key_mask,
        )  # (B, H, Nq, Dv)
        rows = chunk_rows(q.shape[0], q.shape[1], k.shape[2], q.device)
        emulated = pattern.mask_mod is not None  # a sparse pattern at dense cost
        path = f"dense query chunks of {rows} rows (checkpointed)" + gqa_note(q.shape[1], k.shape[1], GROUPED)
        return out, KernelPath(self.name, path, mask_emulated=emulated)
