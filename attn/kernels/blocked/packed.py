"""Packed calls (``document_ids``) in the ``blocked`` kernel: each document is its own call.

Rows are cut at their document boundaries (read on the host) and each document runs alone at
local positions: banded patterns through the band core, full or causal as one dense product per
document (fused SDPA, or ``chunked`` rows with a score term or padding). A packed row costs the
sum of its documents' costs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.documents import Documents
from attn.kernels.blocked.attention import blocked_attention
from attn.kernels.chunked import chunked_attention
from attn.mods import ScoreMod
from attn.pattern import Pattern


def _batch_from(score_mod: ScoreMod | None, row: int) -> ScoreMod | None:
    """``score_mod`` for batch row ``row`` sliced out of the call."""
    if score_mod is None or row == 0:
        return score_mod

    def shifted(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return score_mod(score, b + row, h, i, j)

    return shifted


def document_dense(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None,
                   score_mod: ScoreMod | None, score_params: tuple[Tensor, ...]) -> tuple[Tensor, str]:
    """Exact attention of one document without a mask_mod, ``(1, H, n, Dv)``, and how it ran."""
    if score_mod is None and key_mask is None:
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        grouped = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}  # k, v: (1, H_kv, n, .)
        out = F.scaled_dot_product_attention(q.to(compute), k.to(compute), v.to(compute),
                                             is_causal=causal, **grouped)  # (1, H, n, Dv); Nq == Nk
        return out.to(q.dtype), "fused sdpa"
    out = chunked_attention(q, k, v, score_mod=score_mod, score_params=score_params, causal=causal,
                            key_mask=key_mask)  # (1, H, n, Dv)
    return out, "chunked rows"


def packed_attention(within: Pattern, documents: Documents, q: Tensor, k: Tensor, v: Tensor,
                     causal: bool, key_mask: Tensor | None) -> tuple[Tensor, str]:
    """A packed call ``(B, H, N, .)`` -> ``(B, H, N, Dv)``, each document run alone with ``within``,
    and the path in words."""
    rows, how = [], set()
    segments = documents.segments()
    for row, spans in enumerate(segments):
        score_mod = _batch_from(within.score_mod, row)
        parts = []
        for start, end in spans:
            qs, ks, vs = (t[row : row + 1, :, start:end] for t in (q, k, v))  # (1, H, n_d, .)
            mask = None if key_mask is None else key_mask[row : row + 1, start:end]  # (1, n_d)
            if within.band is not None:
                parts.append(blocked_attention(qs, ks, vs, within.band, causal=causal, key_mask=mask,
                                               score_mod=score_mod))  # (1, H, n_d, Dv)
                how.add("banded blocks")
            else:
                out, used = document_dense(qs, ks, vs, causal=causal, key_mask=mask, score_mod=score_mod,
                                           score_params=within.score_params)
                parts.append(out)
                how.add(used)
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2))  # (1, H, N, Dv)
    out = rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)  # (B, H, N, Dv)
    count = sum(len(spans) for spans in segments)
    return out, f"per document ({count} documents in {len(segments)} rows: {', '.join(sorted(how))})"
