"""Linformer attention (Wang et al. 2020): an attn-bench plug-in.

Keys and values are projected along the sequence to ``proj_len`` rows by learned matrices
``E, F (proj_len, max_len)`` (shared by the heads), then attended as usual:

    out = softmax(Q (E K)^T / sqrt(D)) (F V)

in O(N * proj_len * D). A sequence of ``Nk < max_len`` keys uses the first ``Nk`` columns of
``E`` and ``F``; longer ones are refused (the projections fix the maximum length). Padded
keys (``key_mask``) are zeroed before the projections, so they reach no output. The
projections mix every position: Linformer has no causal form.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from attn import Attention, AttentionCall, KernelPath
from attn.cost import Cost, CostQuery, matmul_flops
from attn.validation import Param


class LinformerAttention(Attention):
    """Linformer: learned (proj_len, max_len) projections of keys and values; non-causal only."""

    exact = False
    supports_causal = False
    native_computes_half_in_float32 = True
    example_params = ({"proj_len": 8, "max_len": 128}, {"proj_len": 128, "max_len": 96})
    param_rules: ClassVar[dict[str, Param]] = {"proj_len": Param(minimum=1), "max_len": Param(minimum=1)}

    def __init__(self, proj_len: int = 256, max_len: int = 4096, **common) -> None:
        self.check_params(proj_len=proj_len, max_len=max_len)
        super().__init__(**common)
        self.proj_len, self.max_len = proj_len, max_len
        # Xavier-normal initialisation (as the authors' code): a projected row keeps the scale of one key
        self.key_proj = nn.Parameter(nn.init.xavier_normal_(torch.empty(proj_len, max_len)))  # E (k, L)
        self.value_proj = nn.Parameter(nn.init.xavier_normal_(torch.empty(proj_len, max_len)))  # F (k, L)

    def native_not_supported_reasons(self, call: AttentionCall) -> list[str]:
        reasons = ["linformer has no causal form (the projections mix all positions)"] if call.causal else []
        if call.k_len is not None and call.k_len > self.max_len:
            reasons.append(f"linformer: {call.k_len} keys exceed max_len={self.max_len} (the projections' length)")
        return reasons

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        if causal:
            raise NotImplementedError("linformer: argument 'causal' must be False; linformer has no causal form")
        k_len = k.shape[2]
        if k_len > self.max_len:  # declared above; kept for direct calls
            raise NotImplementedError(f"linformer: {k_len} keys exceed max_len={self.max_len}")
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        dtype = v.dtype  # the caller's
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        if key_mask is not None:
            real = key_mask[:, None, :, None].to(compute)  # (B, 1, Nk, 1)
            k, v = k * real, v * real
        e = self.key_proj[:, :k_len].to(compute)  # (k, Nk)
        f = self.value_proj[:, :k_len].to(compute)
        k_proj, v_proj = e @ k, f @ v  # (B, H, k, D), (B, H, k, Dv)
        scores = q @ k_proj.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, Nq, k)
        out = torch.softmax(scores, dim=-1) @ v_proj  # (B, H, Nq, Dv)
        return out.to(dtype)

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition at full length: keys and values zero-padded to ``max_len`` (padded
        keys zeroed) and projected by the whole ``E``, ``F``; the softmax written out."""
        pad = self.max_len - k.shape[2]
        real = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool) if key_mask is None else key_mask.cpu()
        real = torch.nn.functional.pad(real, (0, pad))[:, None, :, None].to(q.device, q.dtype)  # (B, 1, L, 1)
        k_full = torch.nn.functional.pad(k, (0, 0, 0, pad)) * real  # (B, H, L, D)
        v_full = torch.nn.functional.pad(v, (0, 0, 0, pad)) * real
        scores = torch.einsum("bhnd,kl,bhld->bhnk", q, self.key_proj.to(q.dtype), k_full) / q.shape[-1] ** 0.5
        weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # (B, H, Nq, k)
        return torch.einsum("bhnk,kl,bhld->bhnd", weights, self.value_proj.to(q.dtype), v_full)

    def native_path(self) -> KernelPath:
        return KernelPath("native", f"linformer (keys and values projected to {self.proj_len} rows)")

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls performed: two (k, Nk) projections, then attention over k rows."""
        k, n = self.proj_len, query.k_len
        fwd = (matmul_flops(k, n, query.head_dim) + matmul_flops(k, n, query.v_dim)
               + matmul_flops(query.q_len, query.head_dim, k) + matmul_flops(query.q_len, k, query.v_dim))
        heads = query.batch * query.heads
        return Cost(heads * fwd, 2 * heads * fwd, "performed")

    def extra_repr(self) -> str:
        return f"proj_len={self.proj_len}, max_len={self.max_len}, kernel={self.kernel!r}"
