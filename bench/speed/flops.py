"""FLOPs of a benchmark case per pass, from the variant's own cost hook (:mod:`attn.cost`).

Exact variants report useful FLOPs (FlashAttention convention on the exact number of allowed
pairs: forward ``4 * B * H * D * P`` for ``Dv == D``, backward 2.5x, forward+backward 3.5x);
approximations report the matmuls they perform (``flops_kind`` says which). Nothing here
names a variant: a plug-in approximation overrides ``cost`` and is measured correctly.
"""

from __future__ import annotations

from attn import Attention
from attn.cost import CostQuery


def case_flops(module: Attention, *, batch: int, heads: int, n: int, head_dim: int,
               causal: bool) -> tuple[dict[str, int], str, float]:
    """FLOPs per pass (self-attention of length ``n``), the flops kind and the mask density
    (allowed pairs / N^2; 1.0 when the variant does not count pairs)."""
    cost = module.cost(CostQuery.self_attention(batch, heads, n, head_dim, causal))
    flops = {"fwd": cost.fwd, "bwd": cost.bwd, "fwd_bwd": cost.fwd_bwd}
    density = cost.pairs / (n * n) if cost.pairs is not None else 1.0
    return flops, cost.kind, density
