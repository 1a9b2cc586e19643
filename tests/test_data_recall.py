"""bench.data.recall: associative recall with the target key at an exact distance."""

from __future__ import annotations

import numpy as np
import pytest

from bench.data import recall


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
