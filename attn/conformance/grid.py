"""The kit's ``grid_matches_mask`` check: a declared token grid (kernel ``factorised``) admits exactly the pairs
the mask_mod admits."""

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
    """``(H, N, N)`` bool: the pairs ``grid`` admits (non-causal), from :meth:`Grid.allows`, not a mask_mod."""
    allowed = torch.zeros(heads, n, n, dtype=torch.bool)
    for h0, h1, axis in grid.head_groups(heads):
        for i in range(n):
            for j in range(n):
                allowed[h0:h1, i, j] = grid.allows(axis, i, j)
    return allowed


def check_grid(module: Attention, params: dict[str, Any]) -> list[CheckResult]:
    """Compare ``module.grid()`` with ``module.mask_mod()`` at ``N = GRID_LEN``, every head."""
    return check_declared(module, params, check=CHECK, what="grid", declared=module.grid(),
                          allows=grid_allows, n=GRID_LEN)
