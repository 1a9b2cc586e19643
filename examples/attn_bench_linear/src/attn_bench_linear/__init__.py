"""Linear transformer attention (Katharopoulos et al. 2020): an attn-bench plug-in.

    out_i = phi(q_i) . sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j),   phi = elu + 1

over the allowed keys j (all, or j <= i when causal: prefix sums), in O(N * D * Dv). Causal
decoding keeps the two sums as its state (``new_decoding_state``), so a step costs the same
at any context length. No softmax and no ``1/sqrt(D)`` scale: it is its own attention, not an
approximation that converges to softmax attention.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor
from torch.nn import functional as F

from attn import Attention, KernelPath
from attn.cost import Cost, CostQuery
from attn.kernelized import (
    KernelizedState,
    dense_kernelized_attention,
    kernelized_attention,
    kernelized_cost,
    streamed_kernelized_attention,
)
from attn.validation import Param


def elu_features(x: Tensor, is_query: bool = True) -> Tensor:
    """The feature map ``phi(x) = elu(x) + 1 > 0``: ``(B, H, N, D)`` -> ``(B, H, N, D)``."""
    return F.elu(x) + 1.0


class LinearAttention(Attention):
    """Linear transformer attention: elu+1 features, causal by prefix sums, O(1)-state decoding."""

    exact = False
    native_computes_half_in_float32 = True
    example_params = ({"chunk": 8}, {"chunk": 128})
    param_rules: ClassVar[dict[str, Param]] = {"chunk": Param(minimum=1)}

    def __init__(self, chunk: int = 128, **common) -> None:
        self.check_params(chunk=chunk)
        super().__init__(**common)
        self.causal_last = False
        self.chunk = chunk  # query rows per causal chunk (C x C products inside a chunk)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        self.causal_last = causal  # for native_path
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        if not causal:  # features a slice of rows at a time: no N-sized feature tensor
            out = streamed_kernelized_attention(lambda x, is_query: elu_features(x.to(compute)), q, k,
                                                v.to(compute), key_mask=key_mask)  # (B, H, Nq, Dv)
            return out.to(v.dtype)
        out = kernelized_attention(
            elu_features(q.to(compute)), elu_features(k.to(compute)), v.to(compute),
            causal=True, key_mask=key_mask, chunk=self.chunk,
        )  # (B, H, Nq, Dv)
        return out.to(v.dtype)

    def native_path(self) -> KernelPath:
        form = "causal: chunked prefix sums" if self.causal_last else "non-causal: features streamed by rows"
        return KernelPath("native", f"linear attention (elu+1 features, {form})")

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition computed directly, O(Nq * Nk)."""
        return dense_kernelized_attention(elu_features(q), elu_features(k), v, causal=causal, key_mask=key_mask)

    def new_decoding_state(self) -> KernelizedState:
        """Causal decoding through the running sums: O(D * Dv) per token at any context length."""
        return KernelizedState(elu_features, self.chunk)

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls performed: D features, the elu a few FLOPs per channel."""
        return kernelized_cost(query, query.head_dim, 3 * query.head_dim, self.chunk)

    def extra_repr(self) -> str:
        return f"chunk={self.chunk}, kernel={self.kernel!r}"
