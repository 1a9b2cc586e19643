"""A token grid of frames x positions and its factorised patterns (ViViT, Arnab et al. 2021): token ``i`` of a
frame-major sequence is position ``i % S`` of frame ``i // S`` (a trailing partial frame is allowed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attn.mods import MaskMod

#: the axes a head group of a factorised pattern attends along
AXES = ("spatial", "temporal")


def head_runs(values: tuple[Any, ...], heads: int, owner: str, field: str) -> list[tuple[int, int, Any]]:
    """``(h0, h1, value)``: ``heads`` split into one contiguous group per value, equal neighbours merged;
    ``ValueError`` when ``heads`` is not divisible by the number of groups."""
    groups = len(values)
    if heads % groups:
        raise ValueError(f"{owner}: {heads} heads are not divisible into the {groups} head groups of "
                         f"{field}={values}")
    size = heads // groups
    runs: list[list[Any]] = []  # [h0, h1, value]
    for g, value in enumerate(values):
        if runs and runs[-1][2] == value:
            runs[-1][1] = (g + 1) * size
        else:
            runs.append([g * size, (g + 1) * size, value])
    return [(h0, h1, value) for h0, h1, value in runs]


@dataclass(frozen=True)
class Grid:
    """``positions`` tokens per frame (``S``) and the axis of each contiguous head group (``axes``; ViViT's model 4
    is ``("spatial", "temporal")``)."""

    positions: int
    axes: tuple[str, ...] = ("spatial",)

    def __post_init__(self) -> None:
        if not isinstance(self.positions, int) or isinstance(self.positions, bool) or self.positions < 1:
            raise ValueError(f"Grid: 'positions' must be an integer >= 1; got {self.positions!r}")
        if not self.axes or any(a not in AXES for a in self.axes):
            raise ValueError(f"Grid: 'axes' must be a non-empty tuple of {list(AXES)}; got {self.axes!r}")

    @property
    def per_head(self) -> bool:
        """True when the heads do not all attend along one axis."""
        return len(set(self.axes)) > 1

    def head_groups(self, heads: int) -> list[tuple[int, int, str]]:
        """``(h0, h1, axis)``: contiguous head ranges with one axis each (:func:`head_runs`)."""
        return head_runs(self.axes, heads, "Grid", "axes")

    def allows(self, axis: str, i: int, j: int) -> bool:
        """The rule of ``axis`` for one pair, written out independently of any mask_mod it checks."""
        s = self.positions
        return i // s == j // s if axis == "spatial" else i % s == j % s

    def pairs(self, n: int, causal: bool) -> tuple[int, ...]:
        """Allowed pairs of each head group's axis in an ``n x n`` call, in closed form."""
        s = self.positions
        full, rest = divmod(n, s)  # complete frames, tokens of the partial one
        counts = []
        for axis in self.axes:
            if axis == "spatial":  # every frame: its tokens squared (or triangle)
                sizes = [s] * full + ([rest] if rest else [])
            else:  # every position: its frames (rest positions have one frame more)
                sizes = [full + 1] * rest + [full] * (s - rest)
            counts.append(sum(m * (m + 1) // 2 if causal else m * m for m in sizes))
        return tuple(counts)


def spatial_mod(positions: int) -> MaskMod:
    """Allowed iff ``i`` and ``j`` are in one frame of ``positions`` tokens: ``i // S == j // S``."""

    def spatial(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return torch.div(i, positions, rounding_mode="floor") == torch.div(j, positions, rounding_mode="floor")

    return spatial


def temporal_mod(positions: int) -> MaskMod:
    """Allowed iff ``i`` and ``j`` are at one position of their frames: ``i % S == j % S``."""

    def temporal(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return (i - j).remainder(positions) == 0

    return temporal


def grid_mod(grid: Grid, num_heads: int | None = None) -> MaskMod:
    """The mask_mod of ``grid``; with several head groups ``num_heads`` must divide by ``len(grid.axes)``."""
    rules = {"spatial": spatial_mod(grid.positions), "temporal": temporal_mod(grid.positions)}
    if not grid.per_head:
        return rules[grid.axes[0]]
    if num_heads is None or num_heads % len(grid.axes):
        raise ValueError(
            f"grid_mod: axes={grid.axes} (one per head group) needs num_heads divisible by "
            f"{len(grid.axes)}; got {num_heads}"
        )
    spatial_rule, temporal_rule = rules["spatial"], rules["temporal"]
    groups = tuple((h0, h1) for h0, h1, axis in grid.head_groups(num_heads) if axis == "spatial")

    def factorised_heads(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        spatial_head = torch.zeros_like(h, dtype=torch.bool)
        for h0, h1 in groups:
            spatial_head = spatial_head | ((h >= h0) & (h < h1))
        return torch.where(spatial_head, spatial_rule(b, h, i, j), temporal_rule(b, h, i, j))

    return factorised_heads
