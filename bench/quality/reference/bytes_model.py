"""Byte-level references: n-gram models fitted on the training bytes and compressors, scoring exactly the bytes a
model's ``bits_per_byte`` scores (:func:`scored_windows`; no context across a window's start)."""

from __future__ import annotations

import gzip
import lzma
from dataclasses import dataclass

import numpy as np


def scored_windows(stream: np.ndarray, length: int, budget: int) -> np.ndarray:
    """``(W, length + 1)`` windows of ``stream`` as the language-model task reads them (one byte shared)."""
    count = max(1, min(budget, len(stream) - 1) // length)
    stream = np.asarray(stream[: count * length + 1], dtype=np.int64)
    index = np.arange(count)[:, None] * length + np.arange(length + 1)[None, :]
    return stream[index]  # (W, length + 1)


def _context_keys(data: np.ndarray, order: int) -> np.ndarray:
    """For every position i >= order, the ``order`` bytes before it packed in one integer (newest lowest)."""
    data = data.astype(np.int64)
    keys = np.zeros(len(data) - order, dtype=np.int64)
    for back in range(1, order + 1):
        keys |= data[order - back: len(data) - back] << (8 * (back - 1))
    return keys


@dataclass(frozen=True)
class _OrderTable:
    """Counts of one context length: ``(context, byte)`` pairs, and per context its total and distinct followers."""

    pair_keys: np.ndarray
    pair_counts: np.ndarray
    context_keys: np.ndarray
    context_totals: np.ndarray
    context_types: np.ndarray

    @staticmethod
    def fit(data: np.ndarray, order: int) -> _OrderTable:
        contexts = _context_keys(data, order)
        pairs = (contexts << 8) | data[order:].astype(np.int64)
        pair_keys, pair_counts = np.unique(pairs, return_counts=True)
        owners = pair_keys >> 8  # sorted, since pair keys are
        context_keys, first, types = np.unique(owners, return_index=True, return_counts=True)
        totals = np.add.reduceat(pair_counts, first)
        return _OrderTable(pair_keys, pair_counts, context_keys, totals, types)

    def lookup(self, contexts: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(count of (context, target), context total, distinct followers)`` per query."""
        pairs = (contexts << 8) | targets
        return (_find(self.pair_keys, self.pair_counts, pairs),
                _find(self.context_keys, self.context_totals, contexts),
                _find(self.context_keys, self.context_types, contexts))


def _find(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at ``queries`` in the sorted ``keys``; 0 where a query is absent."""
    at = np.searchsorted(keys, queries).clip(max=len(keys) - 1)
    return np.where(keys[at] == queries, values[at], 0).astype(np.float64)


class NGramModel:
    """An interpolated Witten-Bell byte n-gram model of ``order`` context bytes: ``P(s | h) = (c + T * P(s | h')) /
    (C + T)``, ``h'`` without the oldest byte, uniform at the bottom."""

    def __init__(self, order: int) -> None:
        if isinstance(order, bool) or not isinstance(order, int) or not 0 <= order <= 7:
            raise ValueError(f"order: must be an integer from 0 to 7 context bytes; got {order!r}")
        self.order = order
        self.tables: list[_OrderTable] = []

    def fit(self, data: np.ndarray) -> NGramModel:
        """Count every context length 0..order over the training bytes ``data (n,)``."""
        data = np.asarray(data, dtype=np.int64)
        if len(data) <= self.order:
            raise ValueError(f"data: needs more than order={self.order} bytes; got {len(data)}")
        self.tables = [_OrderTable.fit(data, k) for k in range(self.order + 1)]
        return self

    def window_bits(self, windows: np.ndarray) -> float:
        """Total bits of predicting ``windows[:, 1:]`` from the bytes before them in each window."""
        if not self.tables:
            raise ValueError("fit() the model before scoring")
        windows = np.asarray(windows, dtype=np.int64)
        length = windows.shape[1] - 1
        targets = windows[:, 1:]  # (W, L)
        prob = np.full(targets.shape, 1.0 / 256)
        for k, table in enumerate(self.tables):
            if k > length:
                break
            # context of target j (window position j + 1): positions j + 1 - k .. j
            context = np.zeros(targets.shape, dtype=np.int64)
            for back in range(1, k + 1):
                context[:, k - 1:] |= windows[:, k - back: length + 1 - back] << (8 * (back - 1))
            count, total, types = table.lookup(context.ravel(), targets.ravel())
            count, total, types = (a.reshape(targets.shape) for a in (count, total, types))
            usable = total > 0
            if k > 0:
                usable[:, : k - 1] = False  # fewer than k bytes before it in its window
            mixed = (count + types * prob) / np.maximum(total + types, 1)
            prob = np.where(usable, mixed, prob)
        return float(-np.log2(prob).sum())


def ngram_bits_per_byte(train: np.ndarray, windows: np.ndarray, order: int) -> float:
    """Bits per scored byte of :class:`NGramModel` ``order`` fitted on ``train``."""
    model = NGramModel(order).fit(train)
    return model.window_bits(windows) / windows[:, 1:].size


def compressed_bits_per_byte(windows: np.ndarray, compressor: str) -> float:
    """Bits per byte of the scored bytes compressed as one file by ``gzip -9`` or ``xz -9e``, header included."""
    raw = np.asarray(windows)[:, 1:].astype(np.uint8).tobytes()  # the scored bytes, in order
    if compressor == "gzip":
        packed = gzip.compress(raw, compresslevel=9, mtime=0)
    elif compressor == "xz":
        packed = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    else:
        raise ValueError(f"compressor: unknown value {compressor!r}; allowed values are "
                         "['gzip', 'xz']")
    return 8.0 * len(packed) / len(raw)
