"""Operands of one chunk of query blocks: strided views into a stream's inputs, or (at the stream's
ends, whose windows leave ``[0, Nk)``) small zero-padded copies.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attn.kernels.blocked.geometry import Geometry, Stream


def padded_rows(x: Tensor, start: int, length: int, fill: float = 0.0) -> Tensor:
    """Rows ``[start, start + length)`` of ``x (N, ...)`` as a new tensor, ``fill`` outside."""
    out = x.new_full((length, *x.shape[1:]), fill)
    lo, hi = max(start, 0), min(start + length, x.shape[0])
    if hi > lo:
        out[lo - start : hi - start] = x[lo:hi]
    return out


def key_span_bias(key_bias: Tensor | None, n_keys: int, start: int, length: int, like: Tensor) -> Tensor:
    """Additive key bias ``(length,)`` for keys ``[start, start + length)``: -inf outside ``[0, n_keys)``."""
    if key_bias is not None:
        return padded_rows(key_bias, start, length, float("-inf"))
    out = like.new_full((length,), float("-inf"))
    lo, hi = max(start, 0), min(start + length, n_keys)
    if hi > lo:
        out[lo - start : hi - start] = 0.0
    return out


def window_view(x: Tensor, start: int, count: int, step: int, length: int) -> Tensor:
    """View ``(count, length, ...)``: rows ``start + t*step + [0, length)`` of ``x (N, ...)``."""
    stride = x.stride()
    return x.as_strided((count, length, *x.shape[1:]), (step * stride[0], *stride),
                        x.storage_offset() + start * stride[0])


class StreamInputs:
    """One stream's views of the inputs, and the global columns (``g`` first keys) it attends.

    ``masked_before (nk + 1,)``: masked keys before each position, on the host, or None (no key
    bias, or an accelerator, where every interior chunk adds the bias instead)."""

    def __init__(self, stream: Stream, q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor | None,
                 key_masked: Tensor | None, num_global: int, global_bias: Tensor | None):
        self.q = stream.view(q, stream.q_rows)
        self.k, self.v = stream.kv_view(k, stream.k_rows), stream.kv_view(v, stream.k_rows)
        self.key_bias = None if key_bias is None else stream.kv_view(key_bias, stream.k_rows)
        self.masked_before = None
        if key_masked is not None:
            masked = stream.kv_view(key_masked, stream.k_rows).to(torch.int64)
            self.masked_before = torch.cat([masked.new_zeros(1), masked.cumsum(0)])
        self.global_k = k[stream.batch, stream.key_head, :num_global] if num_global else None
        self.global_v = v[stream.batch, stream.key_head, :num_global] if num_global else None
        self.global_bias = None if global_bias is None else global_bias[min(stream.batch, global_bias.shape[0] - 1)]


class Chunk:
    """Operands of the blocks ``[first, end)`` of a stream: ``q (c*S, D)``, windows ``k (c, L, D)``,
    ``v (c, L, Dv)``, ``key_bias (c, 1, L)`` or None; valid rows ``[row_start, row_end)``."""

    def __init__(self, stream: Stream, geo: Geometry, first: int, end: int, interior: bool,
                 inputs: StreamInputs):
        rows, keys = geo.block, geo.window_keys
        self.block, self.blocks = rows, end - first
        count = self.blocks
        self.interior = interior
        self.row_start, self.row_end = first * rows, min(end * rows, stream.q_count)
        self.key_start = stream.q_offset - geo.blocks_left * rows + first * rows  # first window key
        self.key_span = (count + geo.window_blocks - 1) * rows  # keys covered by the chunk's windows
        if interior:
            self.q = inputs.q[self.row_start : self.row_end]
            self.k = window_view(inputs.k, self.key_start, count, rows, keys)
            self.v = window_view(inputs.v, self.key_start, count, rows, keys)
            self.key_bias = None
            if inputs.key_bias is not None and (inputs.masked_before is None
                                                or self._has_masked_key(inputs.masked_before)):
                self.key_bias = window_view(inputs.key_bias, self.key_start, count, rows, keys).unsqueeze(1)
        else:
            self.q = padded_rows(inputs.q, self.row_start, count * rows)
            k_span = padded_rows(inputs.k, self.key_start, self.key_span)
            v_span = padded_rows(inputs.v, self.key_start, self.key_span)
            self.k = window_view(k_span, 0, count, rows, keys)
            self.v = window_view(v_span, 0, count, rows, keys)
            bias = key_span_bias(inputs.key_bias, stream.k_count, self.key_start, self.key_span, inputs.q)
            self.key_bias = window_view(bias, 0, count, rows, keys).unsqueeze(1)

    def _has_masked_key(self, masked_before: Tensor) -> bool:
        """True when a key of the chunk's windows is masked (read on the host: no device sync)."""
        return int(masked_before[self.key_start + self.key_span]) > int(masked_before[self.key_start])

    def rows(self, x: Tensor, fill: float = 0.0) -> Tensor:
        """The chunk's query rows of a per-query stream view ``x (nq, ...)``, ``fill`` on padding."""
        if self.interior:
            return x[self.row_start : self.row_end]
        return padded_rows(x, self.row_start, self.blocks * self.block, fill)

    def scatter_keys(self, dst: Tensor, grad_windows: Tensor, geo: Geometry) -> None:
        """``dst (nk, D) +=`` the window gradients ``(c, L, D)``, overlapping windows summed."""
        rows, count = geo.block, self.blocks
        if self.interior:
            for u in range(geo.window_blocks):
                start = self.key_start + u * rows
                dst[start : start + count * rows].unflatten(0, (count, rows)).add_(
                    grad_windows[:, u * rows : (u + 1) * rows])
            return
        acc = dst.new_zeros(self.key_span, dst.shape[-1])  # (span, D)
        for u in range(geo.window_blocks):
            acc[u * rows : (u + count) * rows].unflatten(0, (count, rows)).add_(
                grad_windows[:, u * rows : (u + 1) * rows])
        lo, hi = max(self.key_start, 0), min(self.key_start + self.key_span, dst.shape[0])
        if hi > lo:
            dst[lo:hi].add_(acc[lo - self.key_start : hi - self.key_start])


def chunk_scores(chunk: Chunk, inputs: StreamInputs, edges: Tensor, buf: Tensor, scale: float,
                 score_bias: Tensor | None, global_score_bias: Tensor | None, blocks: slice
                 ) -> tuple[Tensor, Tensor | None]:
    """Scores of a chunk: band ``(c, S, L)`` (into ``buf``) and global columns ``(c*S, g)`` or None."""
    count, rows = chunk.blocks, chunk.block
    band = torch.baddbmm(edges, chunk.q.unflatten(0, (count, rows)), chunk.k.transpose(1, 2), alpha=scale,
                         out=buf[:count])  # (c, S, L)
    if chunk.key_bias is not None:
        band.add_(chunk.key_bias)
    if score_bias is not None:
        band.add_(score_bias[blocks])
    global_scores = None
    if inputs.global_k is not None:
        global_scores = torch.mm(chunk.q, inputs.global_k.t()).mul_(scale)  # (c*S, g)
        if inputs.global_bias is not None:
            global_scores.add_(inputs.global_bias)
        if global_score_bias is not None:
            global_scores.add_(global_score_bias[blocks].flatten(0, 1))
    return band, global_scores
