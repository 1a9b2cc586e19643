"""What one attention call costs in FLOPs: the variant says, generic code only asks.

Every attention answers :meth:`attn.base.Attention.cost` for a :class:`CostQuery` (the shape
of a call). Exact variants count *useful* FLOPs by the FlashAttention convention on the exact
number of allowed (query, key) pairs ``P`` of one (batch, head): forward
``2 * P * (D + Dv)`` (``4 * P * D`` when ``Dv == D``), backward 2.5x forward. Approximate
variants count the matmuls their code performs (``kind`` says which count a number is), so a
plug-in approximation is measured correctly by overriding ``cost`` in its own file.

Position-bias terms and softmax arithmetic are not counted (as in the convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attn.mods import and_masks, causal_mask_mod, index_grids

if TYPE_CHECKING:
    from attn.base import Attention, Band

BWD_FACTOR = 2.5
_COUNT_CHUNK = 1 << 24  # elements of the mask counted at once


@dataclass(frozen=True)
class CostQuery:
    """The shape of one call: ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)``."""

    batch: int
    heads: int
    q_len: int
    k_len: int
    head_dim: int
    v_dim: int
    causal: bool = False
    has_key_mask: bool = False

    @classmethod
    def self_attention(cls, batch: int, heads: int, n: int, head_dim: int,
                       causal: bool = False) -> CostQuery:
        """Self-attention of length ``n`` with ``Dv == D``."""
        return cls(batch, heads, n, n, head_dim, head_dim, causal)


@dataclass(frozen=True)
class Cost:
    """FLOPs of one forward and one backward; ``kind`` names what is counted."""

    fwd: int
    bwd: int
    kind: str  # "useful" (allowed pairs), "performed" (matmuls done), "full_equivalent"
    pairs: int | None = None  # allowed pairs of one (batch, head), for exact variants

    @property
    def fwd_bwd(self) -> int:
        return self.fwd + self.bwd


def band_pairs(band: Band, n: int, causal: bool) -> int:
    """Allowed pairs of an N x N banded pattern (``Band`` semantics), in closed form."""
    g = min(band.num_global, n)
    inner = n - g  # positions outside the global block keep their differences
    offsets = range(0, band.window + 1) if causal else range(-band.window, band.window + 1)
    inner_pairs = sum(max(inner - abs(t * band.dilation), 0) for t in offsets)
    if causal:
        global_pairs = g * n - g * (g - 1) // 2  # j < g and j <= i
    else:
        global_pairs = n * n - inner * inner
    return inner_pairs + global_pairs


def counted_pairs(module: Attention, q_len: int, k_len: int, causal: bool) -> int:
    """Allowed pairs counted from the mask_mod, in chunks of query rows (exact, O(Nq*Nk) work)."""
    mod = and_masks(module.mask_mod(), causal_mask_mod if causal else None)
    if mod is None:
        return q_len * k_len
    b, h, i, j = index_grids(1, 1, q_len, k_len, torch.device("cpu"))
    rows = max(1, _COUNT_CHUNK // max(k_len, 1))
    total = 0
    for start in range(0, q_len, rows):
        allowed = torch.as_tensor(mod(b, h, i[:, :, start:start + rows], j))  # (1|., 1|., r, Nk)
        total += int(allowed.expand(1, 1, min(rows, q_len - start), k_len).sum())
    return total


def allowed_pairs(module: Attention, q_len: int, k_len: int, causal: bool) -> int:
    """Allowed (i, j) pairs of one (batch, head) of a call (bottom-right aligned)."""
    causal = causal or module.forces_causal
    band = module.band()
    if band is not None and q_len == k_len:
        return band_pairs(band, q_len, causal)
    if module.mask_mod() is None:
        if not causal:
            return q_len * k_len
        offset = k_len - q_len  # row r sees keys j <= offset + r
        return sum(max(0, min(k_len, offset + r + 1)) for r in range(q_len))
    return counted_pairs(module, q_len, k_len, causal)


def pairs_cost(pairs: int, query: CostQuery, kind: str = "useful") -> Cost:
    """FlashAttention-convention FLOPs of ``pairs`` allowed pairs per (batch, head)."""
    fwd = 2 * query.batch * query.heads * pairs * (query.head_dim + query.v_dim)
    return Cost(fwd, round(BWD_FACTOR * fwd), kind, pairs)


def exact_cost(module: Attention, query: CostQuery) -> Cost:
    """Useful FLOPs of an exact variant (allowed pairs, FlashAttention convention)."""
    return pairs_cost(allowed_pairs(module, query.q_len, query.k_len, query.causal), query)


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product."""
    return 2 * m * k * n
