"""Synthetic associative recall at controlled distances (docs/quality.md, "Recall"): ``num_pairs`` (value, key)
pairs among fillers, then a query marker and the key of the pair ``d`` tokens back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn.validation import invalid, require_int
from bench.quality.data.token_layout import TokenLayout

PAD_ID = 0
QUERY_ID = 1


@dataclass(frozen=True)
class Layout(TokenLayout):
    """Token id ranges of a recall sequence: padding and the query marker, then keys, values, fillers."""

    reserved: int = 2  # padding, the query marker


def vocab_size(num_keys: int = 16, num_values: int = 8, num_fillers: int = 16) -> int:
    """Number of token ids: 2 (padding, query marker) + keys + values + fillers."""
    return Layout(num_keys, num_values, num_fillers).vocab_size


def pair_gaps(pair_gap: int | Sequence[int]) -> tuple[int, ...]:
    """The allowed gaps between a value and its key: ``pair_gap`` checked, as a tuple."""
    if isinstance(pair_gap, (list, tuple)):
        if not pair_gap:
            raise invalid("pair_gap", "must name at least one gap; got none")
        return tuple(require_int(f"pair_gap[{i}]", g, minimum=1) for i, g in enumerate(pair_gap))
    return (require_int("pair_gap", pair_gap, minimum=1),)


def max_distance(seq_len: int, pair_gap: int | Sequence[int] = 1) -> int:
    """The largest distance ``d`` whose pair fits: the value at ``seq_len - 1 - d - gap >= 0``."""
    return seq_len - 1 - max(pair_gaps(pair_gap))


def generate(
    num_examples: int,
    *,
    seq_len: int,
    distances: Sequence[int],
    num_keys: int = 16,
    num_values: int = 8,
    num_pairs: int = 4,
    num_fillers: int = 16,
    pair_gap: int | Sequence[int] = 1,
    seed: int,
) -> dict[str, np.ndarray]:
    """``num_examples`` recall sequences: int64 ``ids``, ``labels`` (value index), ``distance`` (balanced over
    ``distances``), ``key_position``, ``value_position``, ``query_key``; an integer ``pair_gap`` draws nothing."""
    require_int("num_examples", num_examples, minimum=0)
    require_int("seq_len", seq_len, minimum=4)
    require_int("num_keys", num_keys, minimum=1)
    require_int("num_values", num_values, minimum=1)
    require_int("num_pairs", num_pairs, minimum=1)
    require_int("num_fillers", num_fillers, minimum=1)
    gaps_allowed = pair_gaps(pair_gap)
    widest = max(gaps_allowed)
    dist = np.asarray(tuple(distances), dtype=np.int64).reshape(-1)
    if dist.size == 0:
        raise invalid("distances", "must name at least one distance; got none")
    top = seq_len - 1 - widest
    if np.any(dist < 2) or np.any(dist > top):
        raise invalid(
            "distances",
            f"must lie in [2, seq_len - 1 - pair_gap] = [2, {top}] for seq_len={seq_len} and "
            f"pair_gap={pair_gap}; got {tuple(distances)}",
        )
    if num_pairs > num_keys:
        raise invalid(
            "num_pairs", f"must be at most num_keys={num_keys} (each pair needs its own key); got {num_pairs}"
        )
    per_pair = 2 * (widest + 1)  # a span of gap + 1 tokens, and as much room again to place it
    if per_pair * num_pairs > seq_len - 2:  # the positions before the query marker
        needed = per_pair * num_pairs + 2
        raise invalid("seq_len", f"must be at least {needed} ({per_pair} per pair plus 2 for the query); got {seq_len}")

    layout = Layout(num_keys, num_values, num_fillers)
    rng = np.random.default_rng(seed)
    n = num_examples
    distance = np.resize(dist, n)[rng.permutation(n)] if n else np.zeros(0, np.int64)
    key_pos = seq_len - 1 - distance

    ids = layout.filler_base + rng.integers(0, num_fillers, size=(n, seq_len))
    # the target's key first, then distinct distractors
    keys = np.argsort(rng.random((n, num_keys)), axis=1)[:, :num_pairs]
    values = rng.integers(0, num_values, size=(n, num_pairs))
    if len(gaps_allowed) == 1:  # no draw: an integer gap keeps the random stream of gap 1
        gaps = np.full((n, num_pairs), widest, dtype=np.int64)
    else:
        gaps = np.asarray(gaps_allowed, dtype=np.int64)[rng.integers(0, len(gaps_allowed), size=(n, num_pairs))]

    # Value positions s (key at s + gap): spans [s, s + gap] disjoint, every key < seq_len - 2.
    starts = np.empty((n, num_pairs), dtype=np.int64)
    starts[:, 0] = key_pos - gaps[:, 0]
    todo = np.arange(n)
    for _ in range(1000):
        if todo.size == 0:
            break
        high = seq_len - 2 - (widest if len(gaps_allowed) == 1 else gaps[todo, 1:])
        cand = rng.integers(0, high, size=(todo.size, num_pairs - 1))
        starts[todo, 1:] = cand
        order = np.argsort(starts[todo], axis=1)  # (t, P)
        s = np.take_along_axis(starts[todo], order, axis=1)
        g = np.take_along_axis(gaps[todo], order, axis=1)
        ok = np.all(np.diff(s, axis=1) > g[:, :-1], axis=1)  # the next value after this key
        todo = todo[~ok]
    if todo.size:
        raise RuntimeError("could not place the pairs; lengthen seq_len or use fewer num_pairs")

    rows = np.arange(n)[:, None]
    ids[rows, starts] = layout.value_base + values
    ids[rows, starts + gaps] = layout.key_base + keys
    ids[:, seq_len - 2] = QUERY_ID
    ids[:, seq_len - 1] = layout.key_base + keys[:, 0]
    return {
        "ids": ids.astype(np.int64),
        "labels": values[:, 0].astype(np.int64),
        "distance": distance.astype(np.int64),
        "key_position": key_pos.astype(np.int64),
        "value_position": starts[:, 0].astype(np.int64),
        "query_key": keys[:, 0].astype(np.int64),
    }
