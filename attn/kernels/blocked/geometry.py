"""Block geometry of the ``blocked`` kernel: a block of ``S`` query rows attends to ``L = nw * S`` keys
(``blocks_left`` blocks, its own, ``blocks_right``); a *stream* (one batch element, head and residue class) runs
its blocks in chunks, interior ones through views, edge ones through zero-padded copies."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: scores per chunk of blocks: CPU ~4 MB fp32 (softmax stays in cache); CUDA 128 MB, so a stream is a
#: few chunks, not hundreds of launches (not yet measured on a GPU)
CHUNK_ELEMENTS: dict[str, int] = {"cpu": 1 << 20, "cuda": 1 << 25}


def chunk_elements(device: torch.device | str) -> int:
    """Scores per chunk of blocks on ``device`` (other device types: the CPU's)."""
    return CHUNK_ELEMENTS.get(torch.device(device).type, CHUNK_ELEMENTS["cpu"])


def block_size(window: int) -> int:
    """Query block size for a window: about ``w/2`` (so ``L = S + 2w`` wastes ~25%), 16..64."""
    return max(16, min(64, window // 2 if window >= 32 else window))


def band_edges(block: int, blocks_left: int, blocks_right: int, window: int, causal: bool,
               dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive mask ``(S, L)``: 0 where ``|i - j| <= w`` (and ``j <= i`` if causal), else -inf."""
    row = torch.arange(block, device=device).view(block, 1)  # (S, 1)
    col = torch.arange((blocks_left + 1 + blocks_right) * block, device=device).view(1, -1)  # (1, L)
    offset = row - col + blocks_left * block  # (S, L) = i - j
    allowed = offset.abs() <= window
    if causal:
        allowed &= offset >= 0
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class Geometry:
    """Block layout of one call: rows per block, key blocks left and right, blocks per chunk."""

    block: int
    blocks_left: int
    blocks_right: int
    chunk: int

    @property
    def window_blocks(self) -> int:
        """Key blocks in one block's window (``nw``)."""
        return self.blocks_left + 1 + self.blocks_right

    @property
    def window_keys(self) -> int:
        """Keys in one block's window (``L = nw * S``)."""
        return self.window_blocks * self.block


def geometry(window: int, causal: bool, block: int | None = None, chunk: int | None = None,
             device: torch.device | str = "cpu") -> Geometry:
    """The layout of a band of ``window`` on ``device``; ``block`` and ``chunk`` override the defaults."""
    rows = block or block_size(window)
    left = math.ceil(window / rows)
    right = 0 if causal else left
    per_chunk = chunk or max(1, chunk_elements(device) // (rows * (left + 1 + right) * rows))
    return Geometry(rows, left, right, per_chunk)


@dataclass(frozen=True)
class Stream:
    """One (batch, head, residue class): rows ``q_rows`` of the queries, ``k_rows`` of the keys of head
    ``key_head``. Query row ``m`` sits at stream position ``q_offset + m``, key row ``n`` at ``n`` (absolute:
    ``dilation * position + residue``); ``first_block`` numbers its first block among all streams."""

    batch: int
    head: int
    residue: int
    q_rows: slice
    k_rows: slice
    q_count: int
    k_count: int
    q_offset: int
    first_block: int
    key_head: int  # the head of k, v (and their gradients) it reads: a grouped query head's key head

    def n_blocks(self, block: int) -> int:
        """Query blocks of ``block`` rows covering the stream (the last one may be partial)."""
        return -(-self.q_count // block)

    def view(self, x: Tensor, rows: slice) -> Tensor:
        """The stream's 2-D (or 1-D) view of ``x (B|1, H|1, N, ...)``: no copy."""
        return x[min(self.batch, x.shape[0] - 1), min(self.head, x.shape[1] - 1), rows]

    def kv_view(self, x: Tensor, rows: slice) -> Tensor:
        """The stream's 2-D (or 1-D) view of a key-side ``x (B|1, H_kv|1, Nk, ...)``: no copy."""
        return x[min(self.batch, x.shape[0] - 1), min(self.key_head, x.shape[1] - 1), rows]

    def chunks(self, geo: Geometry) -> list[tuple[int, int, bool]]:
        """Block ranges ``(first, end, interior)``; interior blocks are full with windows inside the keys."""
        first_key = self.q_offset - geo.blocks_left * geo.block  # position of block 0's first window key
        n_blocks = self.n_blocks(geo.block)
        inner_start = min(n_blocks, max(0, -(first_key // geo.block)))
        inner_end = max(inner_start, min(self.q_count // geo.block,
                                         (self.k_count - first_key - geo.window_keys) // geo.block + 1))
        ranges = []
        for lo, hi, interior in ((0, inner_start, False), (inner_start, inner_end, True),
                                 (inner_end, n_blocks, False)):
            ranges += [(t, min(t + geo.chunk, hi), interior) for t in range(lo, hi, geo.chunk)]
        return ranges


def make_streams(batch: int, heads: int, q_len: int, k_len: int, q_offset: int, dilation: int,
                 block: int, groups: int = 1) -> list[Stream]:
    """Streams in (batch, head, residue) order; head ``h`` reads key head ``h // groups``."""
    streams, first_block = [], 0
    for b in range(batch):
        for h in range(heads):
            for residue in range(dilation):
                row0 = (residue - q_offset) % dilation  # first query row whose position is in the class
                q_count = len(range(row0, q_len, dilation))
                if q_count == 0:
                    continue
                stream = Stream(b, h, residue, slice(row0, None, dilation), slice(residue, None, dilation),
                                q_count, len(range(residue, k_len, dilation)), (q_offset + row0) // dilation,
                                first_block, h // groups)
                streams.append(stream)
                first_block += stream.n_blocks(block)
    return streams


def max_chunk_blocks(geo: Geometry, streams: list[Stream]) -> int:
    """Blocks in the largest chunk of any stream (the size of the score buffers)."""
    return min(geo.chunk, max(stream.n_blocks(geo.block) for stream in streams))
