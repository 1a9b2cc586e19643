"""bench.quality.data.splits.split_indices: disjoint, deterministic, grouped and stratified splits."""

from __future__ import annotations

import numpy as np
import pytest

from bench.quality.data.splits import split_indices


def _check_partition(parts: dict[str, np.ndarray], n: int) -> None:
    assert list(parts) == ["train", "val", "test"]
    for idx in parts.values():
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)  # sorted, no repeats
    joined = np.concatenate(list(parts.values()))
    assert joined.size == n
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))


def test_plain_split_sizes_and_determinism() -> None:
    parts = split_indices(1001, seed=3)
    _check_partition(parts, 1001)
    assert [len(v) for v in parts.values()] == [801, 100, 100]
    again = split_indices(1001, seed=3)
    other = split_indices(1001, seed=4)
    assert all(np.array_equal(parts[k], again[k]) for k in parts)
    assert not np.array_equal(parts["test"], other["test"])


def test_groups_never_straddle_splits() -> None:
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(300), rng.integers(1, 40, size=300))
    parts = split_indices(groups.size, seed=1, fractions=(0.7, 0.15, 0.15), groups=groups)
    _check_partition(parts, groups.size)
    seen = [set(groups[idx].tolist()) for idx in parts.values()]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    shares = np.array([len(v) for v in parts.values()]) / groups.size
    np.testing.assert_allclose(shares, [0.7, 0.15, 0.15], atol=0.03)


def test_stratify_keeps_class_proportions() -> None:
    labels = np.repeat([0, 1, 2], [500, 300, 200])
    parts = split_indices(labels.size, seed=0, stratify=labels)
    _check_partition(parts, labels.size)
    for name, share in zip(parts, (0.8, 0.1, 0.1)):
        counts = np.bincount(labels[parts[name]], minlength=3)
        np.testing.assert_allclose(counts, np.array([500, 300, 200]) * share, atol=1)


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.8, 0.1, 0.2), (1.2, -0.1, -0.1)])
def test_bad_fractions_are_rejected(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="fractions"):
        split_indices(10, seed=0, fractions=fractions)


def test_bad_groups_or_stratify() -> None:
    with pytest.raises(ValueError, match="groups"):
        split_indices(10, seed=0, groups=np.zeros(9))
    with pytest.raises(ValueError, match="groups and stratify"):
        split_indices(10, seed=0, groups=np.zeros(10), stratify=np.zeros(10))
