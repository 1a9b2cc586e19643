"""bench.quality.data.recall: associative recall with the target key at an exact distance."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from bench.quality.data import recall


def test_recall_construction() -> None:
    num_keys, num_values, num_pairs, num_fillers, seq_len = 16, 8, 4, 16, 128
    distances = (2, 10, 60, 126)
    out = recall.generate(
        1000, seq_len=seq_len, distances=distances, num_keys=num_keys, num_values=num_values, num_pairs=num_pairs,
        seed=0,
    )  # fmt: skip
    layout = recall.Layout(num_keys, num_values, num_fillers)
    ids, labels, distance = out["ids"], out["labels"], out["distance"]
    assert ids.shape == (1000, seq_len) and ids.dtype == np.int64
    assert labels.dtype == np.int64 and labels.min() >= 0 and labels.max() < num_values
    assert ids.min() >= 1 and ids.max() < recall.vocab_size(num_keys, num_values, num_fillers) == layout.vocab_size
    assert sorted(np.unique(distance, return_counts=True)[1].tolist()) == [250] * 4
    assert np.all(ids[:, -2] == recall.QUERY_ID)
    is_key = (ids >= layout.key_base) & (ids < layout.value_base)
    is_value = (ids >= layout.value_base) & (ids < layout.filler_base)
    for row in range(1000):
        query = ids[row, -1]
        assert layout.key_base <= query < layout.value_base
        assert out["query_key"][row] == query - layout.key_base
        key_positions = np.flatnonzero(is_key[row, :-1])
        assert key_positions.size == num_pairs  # distractor keys are distinct from each other too
        assert len(set(ids[row, key_positions].tolist())) == num_pairs
        matches = key_positions[ids[row, key_positions] == query]
        assert matches.tolist() == [seq_len - 1 - distance[row]] == [out["key_position"][row]]
        # The value sits right before its key; the label is that value.
        assert is_value[row, matches[0] - 1]
        assert labels[row] == ids[row, matches[0] - 1] - layout.value_base
        assert np.all(is_value[row, key_positions - 1])
        assert is_value[row].sum() == num_pairs


def test_determinism_and_errors() -> None:
    a = recall.generate(50, seq_len=64, distances=(4, 32), seed=1)
    b = recall.generate(50, seq_len=64, distances=(4, 32), seed=1)
    c = recall.generate(50, seq_len=64, distances=(4, 32), seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["ids"], c["ids"])
    for bad in [(1,), (63,), ()]:
        with pytest.raises(ValueError, match="distances"):
            recall.generate(5, seq_len=64, distances=bad, seed=0)
    with pytest.raises(ValueError, match="num_pairs"):
        recall.generate(5, seq_len=64, distances=(8,), num_keys=3, num_pairs=4, seed=0)
    with pytest.raises(ValueError, match=r"^seq_len: must be at least 18 \(4 per pair plus 2 for the query\); got 16$"):
        recall.generate(5, seq_len=16, distances=(8,), num_pairs=4, seed=0)


def _check_pairs(out: dict[str, np.ndarray], layout: recall.Layout, gaps: set[int], num_pairs: int) -> set[int]:
    """Every key's value sits one of ``gaps`` before it with only fillers between, spans are
    disjoint, the label is the target's value; returns the gaps seen."""
    ids = out["ids"]
    is_key = (ids >= layout.key_base) & (ids < layout.value_base)
    is_value = (ids >= layout.value_base) & (ids < layout.filler_base)
    is_filler = ids >= layout.filler_base
    seen = set()
    for row in range(len(ids)):
        keys = np.flatnonzero(is_key[row, :-1])
        values = np.flatnonzero(is_value[row])
        assert keys.size == values.size == num_pairs
        for k in keys:
            v = values[values < k].max()  # the nearest value before the key is its own
            assert k - v in gaps and is_filler[row, v + 1 : k].all()  # no other pair inside
            seen.add(int(k - v))
        assert keys.max() < ids.shape[1] - 2  # every key before the query marker
        k, v = out["key_position"][row], out["value_position"][row]
        assert ids[row, k] == ids[row, -1] and k - v in gaps and is_value[row, v]
        assert out["labels"][row] == ids[row, v] - layout.value_base
    return seen


def test_pair_gap_puts_each_value_exactly_gap_before_its_key():
    layout = recall.Layout(16, 8, 16)
    out = recall.generate(400, seq_len=64, distances=(2, 8, 60), pair_gap=3, seed=0)
    assert np.array_equal(out["value_position"], out["key_position"] - 3)
    assert out["value_position"].min() == 0  # d = 60 = seq_len - 1 - gap: the value at the start
    assert _check_pairs(out, layout, {3}, num_pairs=4) == {3}


def test_a_list_of_gaps_draws_one_per_pair():
    layout = recall.Layout(16, 8, 16)
    out = recall.generate(300, seq_len=96, distances=(4, 40), pair_gap=[1, 2, 4], seed=5)
    assert _check_pairs(out, layout, {1, 2, 4}, num_pairs=4) == {1, 2, 4}
    assert set((out["key_position"] - out["value_position"]).tolist()) == {1, 2, 4}


def test_pair_gap_1_reproduces_the_adjacent_layout():
    # sha256 of every array of the generator before pair_gap existed (value then key,
    # adjacent), for these two settings: an old config gets exactly its old data.
    pinned = {
        "1d3dbe8d51404bed855dcdbe94f313b71bf38b176e0fa25fc1499416c38bc3c3":
            dict(seq_len=256, distances=(8, 16, 32, 64, 128, 192), seed=0),
        "9517b5cd29f5402f83505e468b136c22d39eddf8e55e1ff37b4847d3e2c107f9":
            dict(seq_len=32, distances=(4, 8, 16), num_keys=8, num_values=4, num_pairs=2, num_fillers=8, seed=2),
    }
    for digest, settings in pinned.items():
        for gap in (1, [1]):
            out = recall.generate(300, pair_gap=gap, **settings)
            h = hashlib.sha256()
            for key in ("distance", "ids", "key_position", "labels", "query_key"):
                h.update(out[key].tobytes())
            assert h.hexdigest() == digest


def test_pair_gap_errors():
    with pytest.raises(ValueError, match=r"^pair_gap: must be an integer >= 1; got 0$"):
        recall.generate(5, seq_len=64, distances=(8,), pair_gap=0, seed=0)
    with pytest.raises(ValueError, match=r"^pair_gap\[1\]: must be an integer >= 1; got 0$"):
        recall.generate(5, seq_len=64, distances=(8,), pair_gap=[2, 0], seed=0)
    with pytest.raises(ValueError, match=r"^pair_gap: must name at least one gap"):
        recall.generate(5, seq_len=64, distances=(8,), pair_gap=[], seed=0)
    # the value must fit at position 0 or later: d <= seq_len - 1 - gap
    recall.generate(5, seq_len=64, distances=(60,), pair_gap=3, seed=0)
    with pytest.raises(ValueError, match=r"^distances: must lie in \[2, seq_len - 1 - pair_gap\] = \[2, 60\]"):
        recall.generate(5, seq_len=64, distances=(61,), pair_gap=3, seed=0)
    with pytest.raises(ValueError, match=r"^distances: .* = \[2, 59\]"):
        recall.generate(5, seq_len=64, distances=(60,), pair_gap=[1, 4], seed=0)
    with pytest.raises(ValueError, match=r"^seq_len: must be at least 26 \(6 per pair plus 2 for the query\); got 20$"):
        recall.generate(5, seq_len=20, distances=(8,), num_pairs=4, pair_gap=2, seed=0)
