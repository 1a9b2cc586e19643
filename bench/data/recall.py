"""Synthetic associative recall at controlled distances: which attention patterns reach far?

Each sequence of ``seq_len`` tokens holds ``num_pairs`` (key, value) pairs among random filler
tokens and ends with a query: a query marker at position ``seq_len - 2`` and a key at the last
position ``seq_len - 1``. The label is the value paired with that key. Exactly one pair uses the
query key (the target); the other pairs use other, distinct keys (distractors).

A pair is written as two adjacent tokens, **value then key**, with the target key at position
``seq_len - 1 - d`` for a chosen distance ``d`` and its value right before it (distance
``d + 1``). Every token that tells the answer is therefore at least ``d`` positions before the
last token: a model whose last position cannot see ``d`` tokens back (e.g. a sliding window of
width ``w`` stacked ``L`` times reaches about ``L * w``) can do no better than chance
(``1 / num_values``). Distances are balanced over the ``distances`` tuple.

Token ids (see :class:`Layout`): 0 padding (unused: sequences are full), 1 query marker, then
``num_keys`` key ids, ``num_values`` value ids, ``num_fillers`` filler ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn.validation import invalid, require_int

PAD_ID = 0
QUERY_ID = 1


@dataclass(frozen=True)
class Layout:
    """Token id ranges for given vocabulary sizes (``*_base`` is the id of item 0)."""

    num_keys: int
    num_values: int
    num_fillers: int

    @property
    def key_base(self) -> int:
        return 2

    @property
    def value_base(self) -> int:
        return self.key_base + self.num_keys

    @property
    def filler_base(self) -> int:
        return self.value_base + self.num_values

    @property
    def vocab_size(self) -> int:
        return self.filler_base + self.num_fillers


def vocab_size(num_keys: int = 16, num_values: int = 8, num_fillers: int = 16) -> int:
    """Number of token ids: 2 (padding, query marker) + keys + values + fillers."""
    return Layout(num_keys, num_values, num_fillers).vocab_size


def generate(
    num_examples: int,
    *,
    seq_len: int,
    distances: Sequence[int],
    num_keys: int = 16,
    num_values: int = 8,
    num_pairs: int = 4,
    num_fillers: int = 16,
    seed: int,
) -> dict[str, np.ndarray]:
    """Generate ``num_examples`` recall sequences.

    Returns a dict of int64 arrays:

    - ``"ids"`` ``(n, seq_len)``: token ids (no padding; every position is real);
    - ``"labels"`` ``(n,)`` in ``[0, num_values)``: the value index paired with the query key;
    - ``"distance"`` ``(n,)``: ``d`` for each example, each entry of ``distances`` used
      ``n // len(distances)`` or one more times, in random order;
    - ``"key_position"`` ``(n,)``: ``seq_len - 1 - distance``, where the target key sits;
    - ``"query_key"`` ``(n,)`` in ``[0, num_keys)``: the queried key index.

    Each distance must satisfy ``2 <= d <= seq_len - 2`` (the pair must fit before the query
    marker) and ``seq_len`` must leave room for all pairs. Deterministic for a ``seed``.
    """
    require_int("num_examples", num_examples, minimum=0)
    require_int("seq_len", seq_len, minimum=4)
    require_int("num_keys", num_keys, minimum=1)
    require_int("num_values", num_values, minimum=1)
    require_int("num_pairs", num_pairs, minimum=1)
    require_int("num_fillers", num_fillers, minimum=1)
    dist = np.asarray(tuple(distances), dtype=np.int64).reshape(-1)
    if dist.size == 0:
        raise invalid("distances", "must name at least one distance; got none")
    if np.any(dist < 2) or np.any(dist > seq_len - 2):
        raise invalid(
            "distances",
            f"must lie in [2, seq_len - 2] = [2, {seq_len - 2}] for seq_len={seq_len}; got {tuple(distances)}",
        )
    if num_pairs > num_keys:
        raise invalid(
            "num_pairs", f"must be at most num_keys={num_keys} (each pair needs its own key); got {num_pairs}"
        )
    free_slots = seq_len - 2  # positions before the query marker
    if 4 * num_pairs > free_slots:
        needed = 4 * num_pairs + 2
        raise invalid("seq_len", f"must be at least {needed} (4 per pair plus 2 for the query); got {seq_len}")

    layout = Layout(num_keys, num_values, num_fillers)
    rng = np.random.default_rng(seed)
    n = num_examples
    distance = np.resize(dist, n)[rng.permutation(n)] if n else np.zeros(0, np.int64)
    key_pos = seq_len - 1 - distance

    ids = layout.filler_base + rng.integers(0, num_fillers, size=(n, seq_len))
    # Keys: the target's key first, then distinct distractor keys (a random permutation per row).
    keys = np.argsort(rng.random((n, num_keys)), axis=1)[:, :num_pairs]
    values = rng.integers(0, num_values, size=(n, num_pairs))

    # Pair start positions (the value's position s, key at s + 1), non-overlapping, all < seq_len - 2.
    starts = np.empty((n, num_pairs), dtype=np.int64)
    starts[:, 0] = key_pos - 1
    todo = np.arange(n)
    for _ in range(1000):
        if todo.size == 0:
            break
        cand = rng.integers(0, seq_len - 3, size=(todo.size, num_pairs - 1))
        starts[todo, 1:] = cand
        s = np.sort(starts[todo], axis=1)
        ok = np.all(np.diff(s, axis=1) >= 2, axis=1)
        todo = todo[~ok]
    if todo.size:
        raise RuntimeError("could not place the pairs; lengthen seq_len or use fewer num_pairs")

    rows = np.arange(n)[:, None]
    ids[rows, starts] = layout.value_base + values
    ids[rows, starts + 1] = layout.key_base + keys
    ids[:, seq_len - 2] = QUERY_ID
    ids[:, seq_len - 1] = layout.key_base + keys[:, 0]
    return {
        "ids": ids.astype(np.int64),
        "labels": values[:, 0].astype(np.int64),
        "distance": distance.astype(np.int64),
        "key_position": key_pos.astype(np.int64),
        "query_key": keys[:, 0].astype(np.int64),
    }

