"""Packed calls (``document_ids``) in the ``blocked`` kernel, each document its own call (docs/kernels.md,
"Packed calls")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.documents import Documents
from attn.kernels.blocked.attention import blocked_attention
from attn.kernels.chunked import chunked_attention
from attn.mods import ScoreMod, shifted_score_mod
from attn.pattern import Pattern
from attn.precision import upcast


def document_dense(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None,
                   score_mod: ScoreMod | None, score_params: tuple[Tensor, ...]) -> tuple[Tensor, str]:
    """Exact attention of one document without a mask_mod, ``(1, H, n, Dv)``, and how it ran."""
    if score_mod is None and key_mask is None:
        compute = upcast(q.dtype)
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
        score_mod = shifted_score_mod(within.score_mod, batch=row)
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
