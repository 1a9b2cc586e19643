"""``nystrom``: Nystromformer (Xiong et al. 2021), a linear-cost approximation of full attention
(docs/variants.md, "Nystromformer")."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.base import Attention, KernelPath, require_num_heads
from attn.call import AttentionCall
from attn.cost import Cost, CostQuery, matmul_flops, pairs_cost
from attn.gqa import (
    GROUPED,
    expand_how,
    expand_kv,
    fold_queries,
    gqa_note,
    grouped_scores,
    grouped_values,
    unfold_heads,
)
from attn.kernels.reference import dense_attention
from attn.mods import masked_softmax
from attn.precision import upcast, without_autocast
from attn.registration import register_attention
from attn.validation import Param


def segment_means(x: Tensor, num_segments: int, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """Means of ``x (B, H, N, D)`` over ``num_segments`` contiguous segments, ``(B, H, m, D)`` (float32 at least),
    and which hold a real position ``(B|1, 1, m)``; positions where ``valid (B, N)`` is False are left out."""
    batch, heads, length, dim = x.shape
    acc = torch.promote_types(x.dtype, torch.float32)
    if valid is None and length % num_segments == 0:  # equal segments: a reshape, no scatter
        means = x.unflatten(2, (num_segments, length // num_segments)).mean(dim=3, dtype=acc)  # (B, H, m, D)
        return means, torch.ones(1, 1, num_segments, dtype=torch.bool, device=x.device)
    x = x.to(acc)  # index_add sums in the dtype of its operands (a copy only for half inputs)
    segment = torch.arange(length, device=x.device) * num_segments // length  # (N,)
    if valid is None:
        weight = x.new_ones(1, 1, length)  # (1, 1, N)
    else:
        weight = valid.to(x.dtype).view(batch, 1, length)  # (B, 1, N)
        x = x * weight.unsqueeze(-1)
    sums = x.new_zeros(batch, heads, num_segments, dim).index_add(2, segment, x)  # (B, H, m, D)
    counts = weight.new_zeros(weight.shape[0], 1, num_segments).index_add(2, segment, weight)  # (B|1, 1, m)
    means = sums / counts.clamp(min=1.0).unsqueeze(-1)
    return means, counts > 0


def iterative_pinv(a: Tensor, iters: int) -> Tensor:
    """Moore-Penrose pseudo-inverse of ``a (..., m, m)`` by the Nystromformer iteration (docs/variants.md)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    row = a.abs().sum(dim=-1).amax(dim=-1)  # (...)
    col = a.abs().sum(dim=-2).amax(dim=-1)
    z = a.transpose(-2, -1) / (row * col).clamp(min=torch.finfo(a.dtype).tiny)[..., None, None]
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _both(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a & b`` for optional boolean masks (None = all allowed)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


@register_attention("nystrom")
class NystromAttention(Attention):
    """Nystromformer: landmark (segment-mean) approximation of full attention in O(N*m); non-causal only."""

    exact = False
    supports_causal = False
    supports_gqa = True  # grouped: products with the N keys read each key head once
    example_params = ({"num_landmarks": 8}, {"num_landmarks": 4, "conv_kernel": 3})
    convergence_param = "num_landmarks"
    #: the unmasked path's N-sized products run in the input dtype (SDPA); only m x m work is float32
    native_computes_half_in_float32 = False
    param_rules: ClassVar[dict[str, Param]] = {
        "num_landmarks": Param(minimum=1),
        "pinv_iters": Param(minimum=1),
        "conv_kernel": Param(minimum=1, optional=True, odd=True),
    }

    def __init__(
        self, num_landmarks: int = 64, pinv_iters: int = 6, conv_kernel: int | None = None, **common
    ) -> None:
        self.check_params(num_landmarks=num_landmarks, pinv_iters=pinv_iters, conv_kernel=conv_kernel,
                          num_heads=common.get("num_heads"))
        super().__init__(**common)
        self.num_landmarks = num_landmarks
        self.pinv_iters = pinv_iters
        self.conv_kernel = conv_kernel
        self.conv: nn.Conv2d | None = None
        if conv_kernel is not None:
            heads = self.num_heads
            self.conv = nn.Conv2d(
                heads, heads, kernel_size=(conv_kernel, 1), padding=(conv_kernel // 2, 0),
                bias=False, groups=heads,
            )
        self._exact_last = False
        self._fused_last = False
        self._gqa_last = ""

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        super().check_together(params)
        if params.get("conv_kernel") is not None:
            require_num_heads("nystrom", params, "conv_kernel", "one depthwise filter per head")

    def native_not_supported_reasons(self, call: AttentionCall) -> list[str]:
        reasons = ["nystrom has no causal form (landmarks mix all positions)"] if call.causal else []
        if call.self_attention is False and self.conv is not None:
            reasons.append(self._conv_reason(call.q_len, call.k_len))
        return reasons

    def _conv_reason(self, q_len: int | None, k_len: int | None) -> str:
        return f"nystrom: conv_kernel={self.conv_kernel} needs self-attention (Nq == Nk); got Nq={q_len}, Nk={k_len}"

    def native_path(self) -> KernelPath:
        if self._exact_last:
            path = "exact softmax (N <= num_landmarks)"
        elif self._fused_last:
            path = "nystrom landmarks (softmax products via SDPA, input dtype)"
        else:
            path = "nystrom landmarks (masked, materialised (N, m) softmax)"
        return KernelPath("native", path + self._gqa_last)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        if causal:
            raise NotImplementedError("nystrom: argument 'causal' must be False; nystrom has no causal form")
        _, _, q_len, dim = q.shape
        k_len = k.shape[2]
        if self.conv is not None and q_len != k_len:  # declared above; kept for direct calls
            raise NotImplementedError(self._conv_reason(q_len, k_len))
        m = self.num_landmarks
        heads, kv_heads = q.shape[1], k.shape[1]
        self._exact_last = max(q_len, k_len) <= m
        # unmasked, and every segment holds a query and a key: no mask anywhere
        self._fused_last = not self._exact_last and key_mask is None and min(q_len, k_len) >= m
        if self._exact_last:  # N <= m: dense, on k, v expanded (a copy of at most m rows a head)
            self._gqa_last = gqa_note(heads, kv_heads, expand_how(heads, kv_heads))
            out = dense_attention(q, expand_kv(k, heads), expand_kv(v, heads), key_mask=key_mask)
        else:
            # grouped-query: every product with the N keys or values reads them per key head (no copy)
            self._gqa_last = gqa_note(heads, kv_heads, GROUPED)
            if self._fused_last:
                out = self._sdpa_landmark_attention(q, k, v)
            else:
                out = self._landmark_attention(q, k, v, key_mask, dim)
        if self.conv is not None:  # the depthwise skip convolves each query head's values
            v_heads = expand_kv(v, heads)  # (B, H, Nk, Dv)
            v_real = v_heads if key_mask is None else v_heads * key_mask[:, None, :, None].to(v.dtype)
            out = out + self.conv(v_real)  # (B, H, N, Dv)
        return out

    @without_autocast
    def _sdpa_landmark_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Unmasked, N >= m: N-sized products by SDPA in the input dtype; m x m parts in float32."""
        dtype = q.dtype  # the caller's: SDPA's
        heads, kv_heads = q.shape[1], k.shape[1]
        scale = q.shape[-1] ** -0.5  # Q and K scaled by D^-1/4 each
        q_land, _ = segment_means(q, self.num_landmarks, None)  # (B, H, m, D), float32 at least
        k_land, _ = segment_means(k, self.num_landmarks, None)  # (B, H_kv, m, D)
        z = iterative_pinv(torch.softmax(grouped_scores(q_land, k_land) * scale, dim=-1),
                           self.pinv_iters)  # (B, H, m, m)
        # a group's query landmarks attend their key head's N keys together (no copy of k or v)
        kernel_3_v = unfold_heads(F.scaled_dot_product_attention(
            fold_queries(q_land.to(dtype), kv_heads), k, v, scale=scale), heads)  # (B, H, m, Dv)
        landmark_v = z @ kernel_3_v.to(z.dtype)  # (B, H, m, Dv)
        # the landmark values are per query head: expand the key landmarks to H heads (m rows a head)
        k_land_heads = expand_kv(k_land, heads).to(dtype)  # (B, H, m, D)
        return F.scaled_dot_product_attention(q, k_land_heads, landmark_v.to(dtype), scale=scale)  # (B, H, Nq, Dv)

    @without_autocast
    def _landmark_attention(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, dim: int
    ) -> Tensor:
        """Masked or short calls: the masked (N, m) softmax matrices materialised (float32 for half)."""
        m = self.num_landmarks
        compute = upcast(q.dtype)
        dtype = v.dtype  # the caller's
        scale = dim**-0.25  # applied on the landmark side of every product: no scaled copy of Q, K
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        q_len, k_len = q.shape[2], k.shape[2]
        # self-attention padding: masked positions are padding as queries too
        q_valid = key_mask if key_mask is not None and q_len == k_len else None
        q_land, q_land_ok = segment_means(q, m, q_valid)  # (B, H, m, D), (B|1, 1, m)
        k_land, k_land_ok = segment_means(k, m, key_mask)
        q_land, k_land = q_land * scale, k_land * scale  # landmarks of the scaled Q, K
        # a segment is empty only under a mask or when the sequence is shorter than m
        k_cols = None if key_mask is None and k_len >= m else k_land_ok.unsqueeze(-2)  # (B|1, 1, 1, m)
        q_rows = None if q_valid is None and q_len >= m else q_land_ok.unsqueeze(-1)  # (B|1, 1, m, 1)
        key_cols = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, Nk)
        heads = q.shape[1]
        z = iterative_pinv(
            masked_softmax(grouped_scores(q_land, k_land), _both(q_rows, k_cols)), self.pinv_iters
        )  # (B, H, m, m)
        allowed_3 = _both(q_rows, key_cols)
        k_land_heads = expand_kv(k_land, heads)  # (B, H, m, D): m rows a head, whatever H_kv
        kernel_1 = masked_softmax(q @ (k_land_heads * scale).transpose(-2, -1), k_cols)  # (B, H, Nq, m)
        kernel_3 = masked_softmax(grouped_scores(q_land * scale, k), allowed_3)  # (B, H, m, Nk)
        # associate to the right: the only N-sized products are kernel_3 @ V and the last one
        out = kernel_1 @ (z @ grouped_values(kernel_3, v))  # (B, H, Nq, Dv)
        return out.to(dtype)

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls this code performs (``kind="performed"``); below ``m`` tokens, exact attention. Backward:
        unmasked with ``Dv == D`` SDPA recomputes its scores (``3 D + 2 Dv`` a pair), other matmuls cost 2x."""
        q_len, k_len, d, dv = query.q_len, query.k_len, query.head_dim, query.v_dim
        m, iters = self.num_landmarks, self.pinv_iters
        if max(q_len, k_len) <= m:
            return pairs_cost(q_len * k_len, query)
        small = matmul_flops(m, d, m) + 4 * iters * matmul_flops(m, m, m) + matmul_flops(m, m, dv)
        long_fwd = (matmul_flops(m, d, k_len) + matmul_flops(m, k_len, dv)
                    + matmul_flops(q_len, d, m) + matmul_flops(q_len, m, dv))
        fused = not query.has_key_mask and q_len >= m and k_len >= m and d == dv
        long_bwd = 2 * m * (q_len + k_len) * (3 * d + 2 * dv) if fused else 2 * long_fwd
        conv = 0 if self.conv_kernel is None else 2 * k_len * dv * self.conv_kernel
        per_head_fwd = small + long_fwd + conv
        per_head_bwd = 2 * small + long_bwd + 2 * conv
        heads = query.batch * query.heads
        return Cost(heads * per_head_fwd, heads * per_head_bwd, "performed")

    def extra_repr(self) -> str:
        return (
            f"num_landmarks={self.num_landmarks}, pinv_iters={self.pinv_iters}, "
            f"conv_kernel={self.conv_kernel}, kernel={self.kernel!r}"
        )
