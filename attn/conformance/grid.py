"""The kit's ``grid_matches_mask`` check: a variant that declares a token grid (for the kernel
that runs it as batched attention over frames and over positions, ``factorised``) must admit
exactly the pairs its mask_mod admits, so the pattern is never written twice unchecked."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attn.base import Attention
from attn.conformance.harness import HEADS
from attn.conformance.report import CheckResult
from attn.grid import Grid
from attn.mods import dense_allowed

CHECK = "grid_matches_mask"
#: the length of the square call the grid and the mask_mod are compared on: not a multiple of
#: the kit's grids (a partial last frame is part of the definition)
GRID_LEN = 23


def grid_allows(grid: Grid, heads: int, n: int) -> Tensor:
    """``(H, N, N)`` bool: the pairs ``grid`` admits in an ``n x n`` non-causal call, read from
    :meth:`Grid.allows` one (head, i, j) at a time (not from any mask_mod)."""
    allowed = torch.zeros(heads, n, n, dtype=torch.bool)
    for h0, h1, axis in grid.head_groups(heads):
        for i in range(n):
            for j in range(n):
                allowed[h0:h1, i, j] = grid.allows(axis, i, j)
    return allowed


def check_grid(module: Attention, params: dict[str, Any]) -> list[CheckResult]:
    """Pass when ``module.grid()`` admits the pairs ``module.mask_mod()`` admits at
    ``N = GRID_LEN``, every head; fail naming the pairs where they differ."""
    grid, heads, n = module.grid(), module.num_heads or HEADS, GRID_LEN
    if grid is None:
        return [CheckResult(CHECK, "-", params, "skip", "no grid declared")]
    try:
        declared = grid_allows(grid, heads, n)  # (H, N, N)
        mask = dense_allowed(module.mask_mod(), batch=1, heads=heads, q_len=n, k_len=n, causal=False,
                             key_mask=None, device=torch.device("cpu"))  # (1, H|1, N, N) | None
    except Exception as err:
        return [CheckResult(CHECK, "-", params, "fail", f"raised {type(err).__name__}: {err}")]
    expected = torch.ones(heads, n, n, dtype=torch.bool) if mask is None else mask.expand(1, heads, n, n)[0]
    wrong = (declared != expected).nonzero().tolist()
    if not wrong:
        return [CheckResult(CHECK, "-", params, "pass")]
    pairs = ", ".join(
        f"(i={i}, j={j}, head {h}: mask_mod {'allows' if expected[h, i, j] else 'forbids'}, "
        f"grid {'admits' if declared[h, i, j] else 'excludes'} it)"
        for h, i, j in wrong[:5]
    )
    message = (f"the declared grid {grid} and the mask_mod differ at {len(wrong)} (head, i, j) pairs, "
               f"e.g. {pairs} [N={n}, causal=False]")
    return [CheckResult(CHECK, "-", params, "fail", message)]
