"""The ``sdpa`` kernel: ``torch.nn.functional.scaled_dot_product_attention``.

Full attention runs unmasked or with ``is_causal`` (Nq == Nk), PyTorch's fused O(N)-memory
paths. Every other pattern, a position bias, a ``key_mask`` or causal with Nq != Nk
(``is_causal`` is top-left aligned in SDPA, our contract is bottom-right) goes through a
materialised (B|1, H|1, Nq, Nk) mask: the row is flagged ``mask_emulated``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn.base import Attention, KernelPath
from attn.kernels.base import Kernel
from attn.mods import dense_allowed, index_grids


class SdpaKernel(Kernel):
    """PyTorch SDPA; fused for full/causal, mask-emulated otherwise."""

    name = "sdpa"
    description = "torch scaled_dot_product_attention (is_causal or a materialised mask)"

    def supports(self, attention, device, dtype, causal, requires_grad) -> list[str]:
        return self.exactness_reasons(attention)

    def run(self, attention: Attention, q, k, v, causal, key_mask):
        batch, heads, q_len, _ = q.shape
        k_len = k.shape[2]
        mask_mod, score_mod = attention.mask_mod(), attention.score_mod()
        if mask_mod is None and score_mod is None and key_mask is None:
            if not causal:
                out = F.scaled_dot_product_attention(q, k, v)
                return out, KernelPath(self.name, "sdpa(fused, no mask)")
            if q_len == k_len:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return out, KernelPath(self.name, "sdpa(fused, is_causal)")
        allowed = dense_allowed(
            mask_mod, batch=batch, heads=heads, q_len=q_len, k_len=k_len,
            causal=causal, key_mask=key_mask, device=q.device,
        )
        if allowed is None:  # only a score term
            allowed = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q.device)
        row_has_key = allowed.any(dim=-1, keepdim=True)  # (B|1, H|1, Nq, 1)
        allowed = allowed | ~row_has_key  # keep SDPA away from all -inf rows; zeroed below
        if score_mod is None:
            attn_mask = allowed
            path = "sdpa(materialised bool mask)"
        else:
            b, h, i, j = index_grids(batch, heads, q_len, k_len, q.device)
            zeros = torch.zeros((), dtype=q.dtype, device=q.device)
            bias = score_mod(zeros, b, h, i, j).to(q.dtype)  # (B|1, H|1, Nq, Nk)
            attn_mask = bias.masked_fill(~allowed, float("-inf"))
            path = "sdpa(materialised float bias + mask)"
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out = out.masked_fill(~row_has_key, 0.0)
        return out, KernelPath(self.name, path, mask_emulated=True)
