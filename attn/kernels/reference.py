"""The dense reference kernel: the ground truth, built from the mask_mod / score_mod."""

from __future__ import annotations

import math

from torch import Tensor

from attn.gqa import GROUPED, gqa_note, grouped_scores, grouped_values
from attn.kernels.base import Kernel, KernelPath
from attn.mods import MaskMod, ScoreMod, dense_allowed, dense_scores_mod, masked_softmax
from attn.pattern import Pattern
from attn.precision import upcast, without_autocast


@without_autocast
def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    causal: bool = False,
    key_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Materialised softmax attention, O(B*H*Nq*Nk) memory; half precision computed in float32.

    ``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, .)`` -> ``(B, H, Nq, Dv)``; rows with no allowed key give zeros."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    compute = upcast(q.dtype)
    scores = grouped_scores(q.to(compute), k.to(compute)) * scale  # (B, H, Nq, Nk)
    scores = dense_scores_mod(score_mod, scores)
    allowed = dense_allowed(
        mask_mod, batch=batch, heads=heads, q_len=q_len, k_len=k_len,
        causal=causal, key_mask=key_mask, device=q.device,
    )
    probs = masked_softmax(scores, allowed)  # (B, H, Nq, Nk)
    return grouped_values(probs, v.to(compute)).to(q.dtype)  # (B, H, Nq, Dv)


class ReferenceKernel(Kernel):
    """Dense math from the variant's definition: O(N^2) memory, any device, autograd."""

    name = "reference"
    supports_document_ids = True  # the packed mods (attn.documents) in the dense mask
    computes_half_in_float32 = True
    description = "dense materialised attention from the mask_mod/score_mod (ground truth)"
    CUDA_MAX_KEYS = 16_384  # (B, H, N, N) float32 scores: 1 GiB per head at 16K

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        out = dense_attention(
            q, k, v, mask_mod=pattern.mask_mod, score_mod=pattern.score_mod,
            causal=causal, key_mask=key_mask,
        )  # (B, H, Nq, Dv)
        mask_emulated = pattern.mask_mod is not None
        path = "dense softmax" + gqa_note(q.shape[1], k.shape[1], GROUPED)
        return out, KernelPath(self.name, path, mask_emulated=mask_emulated)
