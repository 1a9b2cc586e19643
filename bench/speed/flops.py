"""FLOPs of a case per pass from the variant's own cost hook: nothing here names a variant."""

from __future__ import annotations

from attn import Attention
from attn.cost import CostQuery
from bench.speed.packing import document_lengths


def case_flops(module: Attention, *, batch: int, heads: int, n: int, head_dim: int,
               causal: bool, documents: int = 0) -> tuple[dict[str, int], str, float]:
    """FLOPs per pass (summed over packed ``documents``), the flops kind and the density (allowed pairs / N^2)."""
    lengths = document_lengths(n, documents) if documents else [n]
    costs = [module.cost(CostQuery.self_attention(batch, heads, m, head_dim, causal)) for m in lengths]
    flops = {"fwd": sum(c.fwd for c in costs), "bwd": sum(c.bwd for c in costs),
             "fwd_bwd": sum(c.fwd_bwd for c in costs)}
    pairs = [c.pairs for c in costs]
    return flops, costs[0].kind, (sum(pairs) / (n * n) if None not in pairs else 1.0)
