"""The dense reference kernel: the ground truth, built from the mask_mod / score_mod."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attn.kernels.base import Kernel, KernelPath
from attn.mods import MaskMod, ScoreMod, dense_allowed, dense_scores_mod, masked_softmax

if TYPE_CHECKING:
    from attn.base import Attention


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
    """Materialised softmax attention; half precision is computed in float32.

    Rows with no allowed key give zeros. Memory O(B*H*Nq*Nk).
    """
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    scores = dense_scores_mod(score_mod, scores)
    allowed = dense_allowed(
        mask_mod, batch=batch, heads=heads, q_len=q_len, k_len=k_len,
        causal=causal, key_mask=key_mask, device=q.device,
    )
    probs = masked_softmax(scores, allowed)  # (B, H, Nq, Nk)
    return torch.matmul(probs, v.to(compute)).to(q.dtype)  # (B, H, Nq, Dv)


class ReferenceKernel(Kernel):
    """Dense math from the variant's definition: O(N^2) memory, any device, autograd."""

    name = "reference"
    description = "dense materialised attention from the mask_mod/score_mod (ground truth)"

    def not_supported_reasons(self, attention, call) -> list[str]:
        return self.exactness_reasons(attention)

    def run(self, attention: Attention, q, k, v, causal, key_mask):
        out = dense_attention(
            q, k, v, mask_mod=attention.mask_mod(), score_mod=attention.score_mod(),
            causal=causal, key_mask=key_mask,
        )
        mask_emulated = attention.mask_mod() is not None
        return out, KernelPath(self.name, "dense softmax", mask_emulated=mask_emulated)
