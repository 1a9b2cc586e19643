"""What one attention call costs in FLOPs (docs/variants.md, "Cost"); position-bias terms and softmax
arithmetic are not counted."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.mods import and_masks, causal_mask_mod, index_grids
from attn.pattern import Band, Pattern

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
    #: allowed pairs of one (batch, head), for exact variants; with a head-dependent mask, the
    #: mean over the heads (a float when their total does not divide by H)
    pairs: int | float | None = None

    @property
    def fwd_bwd(self) -> int:
        return self.fwd + self.bwd


def band_pairs(band: Band, n: int, causal: bool) -> int:
    """Allowed pairs of an N x N banded pattern, in closed form; a per-head band raises (use :func:`head_pairs`)."""
    if band.per_head:
        raise ValueError(
            f"band_pairs: a per-head band (group_dilations={band.group_dilations}) has one count per "
            "head; count each band of band.head_groups(heads)"
        )
    g = min(band.num_global, n)
    inner = n - g  # positions outside the global block keep their differences
    offsets = range(0, band.window + 1) if causal else range(-band.window, band.window + 1)
    inner_pairs = sum(max(inner - abs(t * band.dilation), 0) for t in offsets)
    if causal:
        global_pairs = g * n - g * (g - 1) // 2  # j < g and j <= i
    else:
        global_pairs = n * n - inner * inner
    return inner_pairs + global_pairs


def counted_head_pairs(pattern: Pattern, q_len: int, k_len: int, causal: bool, heads: int,
                       device: torch.device | None = None) -> tuple[int, ...]:
    """Allowed pairs of each head, counted from the mask_mod in chunks of query rows on ``device`` (default CPU)."""
    mod = and_masks(pattern.mask_mod, causal_mask_mod if causal else None)
    if mod is None:
        return (q_len * k_len,) * heads
    device = torch.device("cpu") if device is None else device
    b, h, i, j = index_grids(1, heads, q_len, k_len, device)
    rows = max(1, _COUNT_CHUNK // max(k_len * heads, 1))
    totals = torch.zeros(heads, dtype=torch.int64, device=device)
    for start in range(0, q_len, rows):
        allowed = torch.as_tensor(mod(b, h, i[:, :, start:start + rows], j))  # (1|., H|1, r, Nk)
        totals += allowed.expand(1, heads, min(rows, q_len - start), k_len).sum(dim=(0, 2, 3))
    return tuple(int(t) for t in totals)


def counted_pairs(pattern: Pattern, q_len: int, k_len: int, causal: bool,
                  device: torch.device | None = None) -> int:
    """Allowed pairs counted from the mask_mod (head 0), in chunks of query rows (exact, O(Nq*Nk) work)."""
    return counted_head_pairs(pattern, q_len, k_len, causal, 1, device)[0]


def allowed_pairs(pattern: Pattern, q_len: int, k_len: int, causal: bool,
                  device: torch.device | None = None) -> int | float:
    """Allowed (i, j) pairs of one (batch, head) of a call; with a head-dependent mask, the mean over heads."""
    if pattern.per_head:
        heads = pattern.heads
        if heads is None:
            raise ValueError(
                f"{pattern.name}: its mask depends on the head, so counting its pairs needs "
                "parameter 'num_heads'; got None"
            )
        return _mean(sum(head_pairs(pattern, q_len, k_len, causal, heads, device)), heads)
    causal = causal or pattern.always_causal
    band = pattern.band
    if band is not None and q_len == k_len:
        return band_pairs(band, q_len, causal)
    if pattern.mask_mod is None:
        if not causal:
            return q_len * k_len
        offset = k_len - q_len  # row r sees keys j <= offset + r
        return sum(max(0, min(k_len, offset + r + 1)) for r in range(q_len))
    return counted_pairs(pattern, q_len, k_len, causal, device)


def head_pairs(pattern: Pattern, q_len: int, k_len: int, causal: bool, heads: int,
               device: torch.device | None = None) -> tuple[int, ...]:
    """Allowed pairs of each of ``heads`` heads (one batch element); a per-head band in closed form."""
    if not pattern.per_head:
        return (allowed_pairs(pattern, q_len, k_len, causal, device),) * heads
    if pattern.heads is not None and heads != pattern.heads:
        raise ValueError(
            f"{pattern.name}: a call with {heads} heads but the module was built with "
            f"num_heads={pattern.heads} (its mask depends on the head)"
        )
    causal = causal or pattern.always_causal
    band = pattern.band
    if band is not None and q_len == k_len:
        return tuple(band_pairs(group, q_len, causal)
                     for h0, h1, group in band.head_groups(heads) for _ in range(h0, h1))
    return counted_head_pairs(pattern, q_len, k_len, causal, heads, device)


def _mean(total: int, heads: int) -> int | float:
    return total // heads if total % heads == 0 else total / heads


def pairs_cost(pairs: int, query: CostQuery, kind: str = "useful") -> Cost:
    """FlashAttention-convention FLOPs of ``pairs`` allowed pairs per (batch, head)."""
    fwd = 2 * query.batch * query.heads * pairs * (query.head_dim + query.v_dim)
    return Cost(fwd, round(BWD_FACTOR * fwd), kind, pairs)


def head_pairs_cost(per_head: tuple[int, ...], query: CostQuery, kind: str = "useful") -> Cost:
    """FLOPs of heads with their own allowed pairs ``per_head``; ``Cost.pairs`` is their mean."""
    total = sum(per_head)
    fwd = 2 * query.batch * total * (query.head_dim + query.v_dim)
    return Cost(fwd, round(BWD_FACTOR * fwd), kind, _mean(total, len(per_head)))


def exact_cost(pattern: Pattern, query: CostQuery, device: torch.device | None = None) -> Cost:
    """Useful FLOPs of an exact variant; a mask_mod is counted on ``device``."""
    if pattern.per_head:
        per_head = head_pairs(pattern, query.q_len, query.k_len, query.causal, query.heads, device)
        return head_pairs_cost(per_head, query)
    return pairs_cost(allowed_pairs(pattern, query.q_len, query.k_len, query.causal, device), query)


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product."""
    return 2 * m * k * n
