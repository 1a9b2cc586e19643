"""FlexAttention block masks read from a pattern's structure (band, grid, or no mask), never its mask_mod: which
tiles hold an allowed pair, and which only allowed pairs, from block coordinates alone (docs/kernels.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from attn.grid import Grid
from attn.mods import MaskMod
from attn.pattern import Band, Pattern

#: query-block rows classified per step (bounds the int64 temporaries at 512K tokens)
ROWS_PER_STEP = 512
#: one head group's rule: a band, a grid axis with its frame length, or None (no mask)
Rule = Band | tuple[str, int] | None


@dataclass(frozen=True)
class _Tiles:
    """Block coordinates of a row range of tiles: first and last real query and key position."""

    i_lo: Tensor  # (R, 1) absolute query positions
    i_hi: Tensor
    j_lo: Tensor  # (1, C) key positions
    j_hi: Tensor
    causal: bool

    @property
    def d_lo(self) -> Tensor:
        return self.i_lo - self.j_hi  # (R, C): the smallest i - j in the tile

    @property
    def d_hi(self) -> Tensor:
        return self.i_hi - self.j_lo


@dataclass(frozen=True)
class Structure:
    """What a pattern's tiles are read from: its band, its grid, or neither (no mask)."""

    band: Band | None = None
    grid: Grid | None = None

    @classmethod
    def of(cls, pattern: Pattern) -> Structure | None:
        """The structure of ``pattern``, or None (a plug-in's mask_mod or a packed call: ``create_block_mask``)."""
        if pattern.documents is not None:
            return None
        if pattern.band is None and pattern.grid is None and pattern.mask_mod is not None:
            return None
        return cls(pattern.band, pattern.grid)

    def rules(self, heads: int) -> list[tuple[int, int, Rule]]:
        """``(h0, h1, rule)`` per head group."""
        if self.band is not None:
            return list(self.band.head_groups(heads))
        if self.grid is not None:
            return [(h0, h1, (axis, self.grid.positions)) for h0, h1, axis in self.grid.head_groups(heads)]
        return [(0, heads, None)]


def _strided(tiles: _Tiles, stride: int, reach: int | None) -> tuple[Tensor, Tensor]:
    """(any, full) for ``(i - j) % stride == 0 and |i - j| <= reach`` (None: unbounded)."""
    lo = tiles.d_lo
    hi = tiles.d_hi
    floor = 0 if tiles.causal else (None if reach is None else -reach)
    low = lo if floor is None else lo.clamp(min=floor)
    high = hi if reach is None else hi.clamp(max=reach)
    first = -torch.div(-low, stride, rounding_mode="floor") * stride  # first multiple >= low
    any_pair = first <= high
    full = torch.ones_like(any_pair) if stride == 1 else torch.zeros_like(any_pair)
    if floor is not None:
        full = full & (lo >= floor)
    if reach is not None:
        full = full & (hi <= reach)
    return any_pair, full


def _global(tiles: _Tiles, num_global: int) -> tuple[Tensor, Tensor]:
    """(any, full) for ``i < g or j < g`` (with causal's ``j <= i``)."""
    rows = tiles.i_lo < num_global
    cols = tiles.j_lo < num_global
    if tiles.causal:  # a global row needs a key at or before it; a global key a query after it
        rows = rows & (tiles.j_lo <= tiles.i_hi.clamp(max=num_global - 1))
        cols = cols & (tiles.i_hi >= tiles.j_lo)
    full = (tiles.i_hi < num_global) | (tiles.j_hi < num_global)
    if tiles.causal:
        full = full & (tiles.d_lo >= 0)
    return rows | cols, full


def _spatial(tiles: _Tiles, positions: int) -> tuple[Tensor, Tensor]:
    """(any, full) for ``i // S == j // S`` (a superset under causal)."""
    fi_lo, fi_hi = tiles.i_lo // positions, tiles.i_hi // positions
    fj_lo, fj_hi = tiles.j_lo // positions, tiles.j_hi // positions
    any_pair = (fi_lo <= fj_hi) & (fj_lo <= fi_hi)
    full = (fi_lo == fi_hi) & (fj_lo == fj_hi) & (fi_lo == fj_lo)
    if tiles.causal:
        any_pair = any_pair & (tiles.j_lo <= tiles.i_hi)
        full = full & (tiles.d_lo >= 0)
    return any_pair, full


def _band_tiles(tiles: _Tiles, band: Band) -> tuple[Tensor, Tensor]:
    any_pair, full = _strided(tiles, band.dilation, band.dilation * band.window)
    if band.num_global:
        any_g, full_g = _global(tiles, band.num_global)
        any_pair, full = any_pair | any_g, full | full_g
    return any_pair, full


def _classify(rule: Rule, tiles: _Tiles) -> tuple[Tensor, Tensor]:
    if rule is None:
        return _strided(tiles, 1, None)
    if isinstance(rule, Band):
        return _band_tiles(tiles, rule)
    axis, positions = rule  # a grid axis
    return _spatial(tiles, positions) if axis == "spatial" else _strided(tiles, positions, None)


def tile_masks(structure: Structure, *, causal: bool, q_len: int, k_len: int, q_pad: int,
               k_pad: int, heads: int, block: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Bool ``(1, H|1, Nq_pad / block, Nk_pad / block)`` masks of the tiles holding an allowed
    pair and of the tiles holding only allowed pairs (``H`` when the rule differs per head)."""
    q_blocks, k_blocks = -(-q_pad // block), -(-k_pad // block)
    rules = structure.rules(heads)
    shared = len(rules) == 1
    groups = 1 if shared else heads
    any_out = torch.zeros(1, groups, q_blocks, k_blocks, dtype=torch.bool, device=device)
    full_out = torch.zeros_like(any_out)
    offset = k_len - q_len
    col = torch.arange(k_blocks, device=device)
    j_lo = (col * block).view(1, -1)  # (1, C)
    j_hi = ((col + 1) * block).clamp(max=k_len).view(1, -1) - 1
    real_cols = j_lo < k_len
    whole_cols = (col + 1).view(1, -1) * block <= k_len  # no padded key in the tile
    for start in range(0, q_blocks, ROWS_PER_STEP):
        row = torch.arange(start, min(start + ROWS_PER_STEP, q_blocks), device=device)
        r_lo = row * block
        i_lo = (r_lo + offset).view(-1, 1)  # (R, 1)
        i_hi = ((r_lo + block).clamp(max=q_len) - 1 + offset).view(-1, 1)
        real_rows = (r_lo < q_len).view(-1, 1)
        whole_rows = ((row + 1) * block <= q_pad).view(-1, 1)
        tiles = _Tiles(i_lo, i_hi, j_lo, j_hi, causal)
        for h0, h1, rule in rules:
            any_pair, full = _classify(rule, tiles)
            any_pair = any_pair & real_rows & real_cols
            full = full & any_pair & whole_rows & whole_cols
            heads_out = slice(0, 1) if shared else slice(h0, h1)
            any_out[0, heads_out, start:start + len(row)] = any_pair
            full_out[0, heads_out, start:start + len(row)] = full
    return any_out, full_out


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of ``dense (1, H, R, C)``: marked-tile count and ascending columns, without a sort."""
    counts = dense.sum(dim=-1, dtype=torch.int32)  # (1, H, R)
    batch, head, row, col = dense.nonzero(as_tuple=True)  # row-major order: columns ascending
    starts = counts.flatten().cumsum(0) - counts.flatten()  # first slot of each row
    flat_row = (batch * dense.shape[1] + head) * dense.shape[2] + row
    slot = torch.arange(len(col), device=dense.device) - starts[flat_row]
    indices = torch.zeros(dense.shape, dtype=torch.int32, device=dense.device)
    indices[batch, head, row, slot] = col.to(torch.int32)
    return counts.contiguous(), indices


def structured_block_mask(structure: Structure, mask_mod: MaskMod, *, causal: bool, q_len: int,
                          k_len: int, q_pad: int, k_pad: int, heads: int, block: int,
                          device: torch.device, key_mask: bool) -> BlockMask:
    """The block mask of ``structure`` for a call padded to ``(q_pad, k_pad)``; ``mask_mod`` applies in
    partial tiles; ``key_mask``: no tile is full."""
    any_pair, full = tile_masks(structure, causal=causal, q_len=q_len, k_len=k_len, q_pad=q_pad,
                                k_pad=k_pad, heads=heads, block=block, device=device)
    if key_mask:
        full = torch.zeros_like(full)
    partial = any_pair & ~full
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    q_num, q_idx = _ordered(partial.transpose(-2, -1))  # the same tiles by key block (backward)
    full_q_num, full_q_idx = _ordered(full.transpose(-2, -1))
    return BlockMask(seq_lengths=(q_pad, k_pad), kv_num_blocks=kv_num, kv_indices=kv_idx,
                     full_kv_num_blocks=full_num, full_kv_indices=full_idx, q_num_blocks=q_num,
                     q_indices=q_idx, full_q_num_blocks=full_q_num, full_q_indices=full_q_idx,
                     BLOCK_SIZE=(block, block), mask_mod=mask_mod)
