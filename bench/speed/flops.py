"""FLOPs of a benchmark case per pass, from the variant's own cost hook (:mod:`attn.cost`).

Exact variants report useful FLOPs (FlashAttention convention on the exact number of allowed
pairs: forward ``4 * B * H * D * P`` for ``Dv == D``, backward 2.5x, forward+backward 3.5x);
approximations report the matmuls they perform (``flops_kind`` says which). Nothing here
names a variant: a plug-in approximation overrides ``cost`` and is measured correctly.
"""

from __future__ import annotations

from attn import Attention
from attn.cost import CostQuery
from bench.speed.packing import document_lengths


def case_flops(module: Attention, *, batch: int, heads: int, n: int, head_dim: int,
               causal: bool, documents: int = 0) -> tuple[dict[str, int], str, float]:
    """FLOPs per pass (self-attention of length ``n``; with ``documents``, the sum over the
    packed documents' lengths, :func:`bench.speed.packing.document_lengths`), the flops kind
    and the mask density (allowed pairs / N^2; 1.0 when the variant does not count pairs)."""
    lengths = document_lengths(n, documents) if documents else [n]
    costs = [module.cost(CostQuery.self_attention(batch, heads, m, head_dim, causal)) for m in lengths]
    flops = {"fwd": sum(c.fwd for c in costs), "bwd": sum(c.bwd for c in costs),
             "fwd_bwd": sum(c.fwd_bwd for c in costs)}
    pairs = [c.pairs for c in costs]
    density = sum(pairs) / (n * n) if None not in pairs else 1.0
    return flops, costs[0].kind, density
