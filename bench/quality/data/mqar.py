"""Synthetic multi-query associative recall (Arora et al. 2023, "Zoology"; docs/quality.md, "MQAR"): ``P`` pairs,
then fillers among which every key is queried once more, at power-law spaced positions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn.validation import invalid, require_int, require_int_list
from bench.quality.data.token_layout import TokenLayout

PAD_ID = 0
IGNORE = -100  # the label of every position that is not a query (cross entropy's ignore_index)
_CHUNK = 4096  # rows of query-position draws at a time (bounds the (rows, seq_len) scratch)


@dataclass(frozen=True)
class Layout(TokenLayout):
    """Token id ranges of an MQAR sequence: padding, then keys, values, fillers."""

    reserved: int = PAD_ID + 1  # padding


def vocab_size(num_keys: int = 64, num_values: int = 64, num_fillers: int = 16) -> int:
    """Number of token ids: 1 (padding) + keys + values + fillers."""
    return Layout(num_keys, num_values, num_fillers).vocab_size


def _check_pairs(num_pairs: int | Sequence[int], *, seq_len: int, num_keys: int) -> np.ndarray:
    """``num_pairs`` as an int64 array, each count checked against the keys and the length."""
    counts = require_int_list("num_pairs", num_pairs, minimum=1)
    largest = max(counts)
    if largest > num_keys:
        raise invalid("num_pairs", f"must be at most num_keys={num_keys} (each pair needs its "
                                   f"own key); got {counts}")
    if 3 * largest > seq_len:
        raise invalid("seq_len", f"must be at least {3 * largest} (2 per pair plus 1 per query "
                                 f"for num_pairs={largest}); got {seq_len}")
    return np.asarray(counts, dtype=np.int64)


def _query_positions(rng: np.random.Generator, pairs: np.ndarray, seq_len: int) -> np.ndarray:
    """Sorted query positions ``(n, max P)``, -1 padded: the Gumbel top-k of ``log(1 / (gap + 1))``."""
    n, most = len(pairs), int(pairs.max(initial=1))
    out = np.full((n, most), -1, dtype=np.int64)
    pos = np.arange(seq_len)  # (N,)
    for start in range(0, n, _CHUNK):
        p = pairs[start:start + _CHUNK, None]  # (R, 1)
        gap = pos[None, :] - 2 * p  # (R, N)
        score = np.where(gap >= 0, -np.log1p(np.maximum(gap, 0)), -np.inf)
        score = score + rng.gumbel(size=score.shape)  # (R, N)
        top = np.argsort(-score, axis=1)[:, :most]  # (R, most): best first
        rank = np.arange(most)[None, :]
        chosen = np.where(rank < p, top, seq_len)  # rows with fewer pairs: pad past the end
        chosen.sort(axis=1)
        out[start:start + _CHUNK] = np.where(chosen < seq_len, chosen, -1)
    return out


def generate(
    num_examples: int,
    *,
    seq_len: int,
    num_pairs: int | Sequence[int],
    num_keys: int = 64,
    num_values: int = 64,
    num_fillers: int = 16,
    seed: int,
) -> dict[str, np.ndarray]:
    """``num_examples`` MQAR sequences: int64 ``ids``, ``labels`` (value index at a query, else -100), ``num_pairs``
    (balanced over ``num_pairs``) and ``distance`` (query minus key position at a query, else -1)."""
    require_int("num_examples", num_examples, minimum=0)
    require_int("seq_len", seq_len, minimum=3)
    require_int("num_keys", num_keys, minimum=1)
    require_int("num_values", num_values, minimum=1)
    require_int("num_fillers", num_fillers, minimum=1)
    counts = _check_pairs(num_pairs, seq_len=seq_len, num_keys=num_keys)

    layout = Layout(num_keys, num_values, num_fillers)
    rng = np.random.default_rng(seed)
    n, most = num_examples, int(counts.max())
    pairs = np.resize(counts, n)[rng.permutation(n)] if n else np.zeros(0, np.int64)  # (n,)

    ids = layout.filler_base + rng.integers(0, num_fillers, size=(n, seq_len))  # (n, N)
    keys = np.argsort(rng.random((n, num_keys)), axis=1)[:, :most]  # (n, most): distinct per row
    values = rng.integers(0, num_values, size=(n, most))  # (n, most)
    used = np.arange(most)[None, :] < pairs[:, None]  # (n, most): pair slot i is written

    rows, slot = np.nonzero(used)
    ids[rows, 2 * slot] = layout.key_base + keys[rows, slot]
    ids[rows, 2 * slot + 1] = layout.value_base + values[rows, slot]

    positions = _query_positions(rng, pairs, seq_len)  # (n, most), -1 past P
    order = np.argsort(np.where(used, rng.random((n, most)), np.inf), axis=1)  # (n, most)
    labels = np.full((n, seq_len), IGNORE, dtype=np.int64)
    distance = np.full((n, seq_len), -1, dtype=np.int64)
    q_rows, q_rank = np.nonzero(positions >= 0)
    q_pos, q_slot = positions[q_rows, q_rank], order[q_rows, q_rank]
    ids[q_rows, q_pos] = layout.key_base + keys[q_rows, q_slot]
    labels[q_rows, q_pos] = values[q_rows, q_slot]
    distance[q_rows, q_pos] = q_pos - 2 * q_slot
    return {
        "ids": ids.astype(np.int64),
        "labels": labels,
        "num_pairs": pairs.astype(np.int64),
        "distance": distance,
    }
