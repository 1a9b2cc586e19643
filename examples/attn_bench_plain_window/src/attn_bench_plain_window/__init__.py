"""Local-window attention as a plain ``nn.Module``: an attn-bench plug-in that never imports attn."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


class LocalWindowAttention(nn.Module):
    """Local window attention: query i sees key j iff |i - j| <= window (plain module plug-in)."""

    #: optional: parameter sets that make attn-bench's conformance kit meaningful at short lengths
    example_params = ({"window": 2}, {"window": 0})
    #: optional (default False): whether k, v may have fewer heads than q (grouped-query
    #: attention); ``q @ k.transpose(-2, -1)`` below needs equal heads, so it says no and the
    #: suite refuses such a call before it reaches this module ("GQA: not supported" in the kit)
    supports_gqa = False

    def __init__(self, window: int = 4) -> None:
        super().__init__()
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"LocalWindowAttention: parameter 'window' must be an integer >= 0; got {window!r}")
        self.window = window

    def mask_mod(self) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        """Optional: the pattern as allowed(b, h, i, j), so the kit compares against its dense reference."""
        window = self.window
        return lambda b, h, i, j: (i - j).abs() <= window

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
    ) -> Tensor:
        """q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv) -> (B, H, Nq, Dv); key_mask (B, Nk) True = real."""
        q_len, k_len = q.shape[2], k.shape[2]
        q_pos = torch.arange(q_len, device=q.device) + (k_len - q_len)  # (Nq,) bottom-right aligned
        k_pos = torch.arange(k_len, device=q.device)  # (Nk,)
        offset = q_pos[:, None] - k_pos[None, :]  # (Nq, Nk)
        allowed = offset.abs() <= self.window
        if causal:
            allowed = allowed & (offset >= 0)
        allowed = allowed[None, None]  # (1, 1, Nq, Nk)
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]  # (B, 1, Nq, Nk)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Nq, Nk)
        has_key = allowed.any(dim=-1, keepdim=True)  # rows with no allowed key give zeros
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~has_key, 0.0)
        weights = torch.softmax(scores, dim=-1).masked_fill(~has_key, 0.0)
        return weights @ v  # (B, H, Nq, Dv)
