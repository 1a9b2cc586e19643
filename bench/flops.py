"""Analytic useful FLOPs (FlashAttention convention) from the exact number of allowed pairs.

Forward ``4 * B * H * D * P`` where ``P`` is the number of allowed (query, key) pairs of one
(batch, head) (``Nq * Nk_eff``); backward ``2.5x`` forward; forward+backward ``3.5x``.
``flops_kind`` says what is counted:

- ``useful``: exact variants, ``P`` counted exactly (closed form for banded patterns,
  chunked counting of the mask_mod otherwise). Position-bias terms are not counted.
- ``nystrom_actual``: the matmuls Nystromformer really does for ``m`` landmarks (per head):
  ``2*N*m*D`` (Q K~^T) + ``2*m*m*D`` (Q~ K~^T) + ``2*m*N*D`` (Q~ K^T) + ``8*m^3*iters``
  (pseudo-inverse, 4 m x m matmuls per iteration) + ``2*m*N*D`` (kernel_3 V)
  + ``2*N*m*m`` (kernel_1 Z) + ``2*N*m*D`` (final product); backward 2x (two matmuls per
  matmul), forward+backward 3x. When ``N <= m`` it is exact attention (``useful``).
"""

from __future__ import annotations

import torch

from attn.base import Attention, Band

BWD_FACTOR = 2.5
CHUNK_ELEMENTS = 1 << 24


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
    from attn.mods import and_masks, causal_mask_mod, index_grids

    mod = and_masks(module.mask_mod(), causal_mask_mod if causal else None)
    if mod is None:
        return q_len * k_len
    b, h, i, j = index_grids(1, 1, q_len, k_len, torch.device("cpu"))
    rows = max(1, CHUNK_ELEMENTS // max(k_len, 1))
    total = 0
    for start in range(0, q_len, rows):
        allowed = torch.as_tensor(mod(b, h, i[:, :, start:start + rows], j))  # (1|., 1|., r, Nk)
        allowed = allowed.expand(1, 1, min(rows, q_len - start), k_len)
        total += int(allowed.sum())
    return total


def allowed_pairs(module: Attention, n: int, causal: bool) -> int:
    """Allowed (i, j) pairs of one (batch, head) for self-attention of length ``n``."""
    causal = causal or module.forces_causal
    band = module.band()
    if band is not None:
        return band_pairs(band, n, causal)
    if module.mask_mod() is None:
        return n * (n + 1) // 2 if causal else n * n
    return counted_pairs(module, n, n, causal)


def nystrom_forward_flops(n: int, d: int, m: int, iters: int) -> int:
    """Matmul FLOPs of one (batch, head) Nystromformer forward (see module docstring)."""
    return (2 * n * m * d + 2 * m * m * d + 2 * m * n * d + 8 * m**3 * iters
            + 2 * m * n * d + 2 * n * m * m + 2 * n * m * d)


def case_flops(module: Attention, *, batch: int, heads: int, n: int, head_dim: int,
               causal: bool) -> tuple[dict[str, int], str, float]:
    """FLOPs per pass, the flops kind and the mask density (allowed pairs / N^2)."""
    m = getattr(module, "num_landmarks", None)
    if not module.exact and m is not None and n > m:
        fwd = batch * heads * nystrom_forward_flops(n, head_dim, m, module.pinv_iters)
        return {"fwd": fwd, "bwd": 2 * fwd, "fwd_bwd": 3 * fwd}, "nystrom_actual", 1.0
    if not module.exact:  # exact attention below the landmark count, else unknown: full-equivalent
        pairs, kind = n * n, ("useful" if m is not None else "full_equivalent")
    else:
        pairs, kind = allowed_pairs(module, n, causal), "useful"
    fwd = 4 * batch * heads * pairs * head_dim
    flops = {"fwd": fwd, "bwd": round(BWD_FACTOR * fwd), "fwd_bwd": round((1 + BWD_FACTOR) * fwd)}
    return flops, kind, pairs / (n * n)
