"""The kit's ``grid_matches_mask`` check: a variant that declares a token grid (for the kernel
that runs it as batched attention over frames and over positions, ``factorised``) must admit
exactly the pairs its mask_mod admits, so the pattern is never written twice unchecked."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attn.base import Attention
from attn.conformance.band import check_declared
from attn.conformance.report import CheckResult
from attn.grid import Grid

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
    return check_declared(module, params, check=CHECK, what="grid", declared=module.grid(),
                          allows=grid_allows, n=GRID_LEN)
