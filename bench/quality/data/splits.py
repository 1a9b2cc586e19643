"""Deterministic train/val/test splits of item indices."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attn.validation import invalid, require_int

SPLIT_NAMES = ("train", "val", "test")


def split_indices(
    n: int,
    *,
    seed: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    groups: Sequence[int] | np.ndarray | None = None,
    stratify: Sequence[int] | np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Split ``range(n)`` into disjoint, sorted int64 ``"train"``, ``"val"``, ``"test"`` indices; ``groups`` (an id
    per item) keeps each group in one split, ``stratify`` (a label per item) splits each class alone; not both."""
    n = int(require_int("n", n, minimum=0))
    shares = check_fractions(fractions)
    if groups is not None and stratify is not None:
        raise ValueError("groups and stratify cannot be combined; pass one of them")
    rng = np.random.default_rng(seed)

    if groups is not None:
        assignment = _assign_groups(_check_labels(groups, n, "groups"), shares, rng)
    elif stratify is not None:
        labels = _check_labels(stratify, n, "stratify")
        assignment = np.empty(n, dtype=np.int64)
        for cls in np.unique(labels):
            members = np.flatnonzero(labels == cls)
            assignment[members] = _assign_items(len(members), shares, rng)
    else:
        assignment = _assign_items(n, shares, rng)

    return {name: np.flatnonzero(assignment == k).astype(np.int64) for k, name in enumerate(SPLIT_NAMES)}


def split_groups_stratified(
    groups: Sequence[int] | np.ndarray,
    stratify: Sequence[int] | np.ndarray,
    *,
    seed: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
) -> dict[str, np.ndarray]:
    """Whole groups to one split, stratified by class: each group is filed under its members' most common class
    (smallest label on a tie), and each class's groups are split as ``split_indices(groups=...)``."""
    group_array = np.asarray(groups)
    if group_array.ndim != 1:
        raise invalid("groups", f"must be one-dimensional (one group id per item); got shape {group_array.shape}")
    n = group_array.size
    labels = _check_labels(stratify, n, "stratify")
    shares = check_fractions(fractions)
    rng = np.random.default_rng(seed)
    _, group_of = np.unique(group_array, return_inverse=True)
    classes, label_of = np.unique(labels, return_inverse=True)
    group_of, label_of = group_of.reshape(-1), label_of.reshape(-1)
    counts = np.zeros((int(group_of.max(initial=-1)) + 1, classes.size), dtype=np.int64)
    np.add.at(counts, (group_of, label_of), 1)
    stratum = counts.argmax(axis=1)[group_of] if n else group_of  # each item's group's class
    assignment = np.empty(n, dtype=np.int64)
    for cls in range(classes.size):
        members = np.flatnonzero(stratum == cls)
        assignment[members] = _assign_groups(group_of[members], shares, rng)
    return {name: np.flatnonzero(assignment == k).astype(np.int64) for k, name in enumerate(SPLIT_NAMES)}


def check_fractions(fractions: Sequence[float], *, normalise: bool = True) -> np.ndarray:
    """``fractions`` (train, val, test) checked, as float64 shares (``normalise``: scaled to sum to 1 exactly)."""
    shares = np.asarray(fractions, dtype=np.float64)
    if shares.shape != (3,) or np.any(shares < 0) or not np.isclose(shares.sum(), 1.0, atol=1e-6):
        raise invalid(
            "fractions", f"must be three non-negative numbers (train, val, test) summing to 1; got {fractions!r}"
        )
    return shares / shares.sum() if normalise else shares


def _check_labels(values: Sequence[int] | np.ndarray, n: int, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (n,):
        raise invalid(name, f"must have one entry per item (shape ({n},)); got shape {array.shape}")
    return array


def _rounded_counts(total: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` closest to ``total * shares`` (largest remainder)."""
    exact = total * shares
    counts = np.floor(exact).astype(np.int64)
    remainder = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


def _assign_items(total: int, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Split id (0, 1, 2) for each of ``total`` items, with sizes from the rounded shares."""
    counts = _rounded_counts(total, shares)
    assignment = np.repeat(np.arange(3, dtype=np.int64), counts)
    return assignment[rng.permutation(total)]


def _assign_groups(groups: np.ndarray, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Split id per item such that every group lands in exactly one split."""
    unique, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    order = rng.permutation(len(unique))
    # a group goes to the split in which the midpoint of its item range falls
    ends = np.cumsum(sizes[order])
    mids = ends - sizes[order] / 2.0
    bounds = np.cumsum(shares)[:2] * len(groups)
    split_of_ordered = np.searchsorted(bounds, mids, side="right")
    split_of_group = np.empty(len(unique), dtype=np.int64)
    split_of_group[order] = split_of_ordered
    return split_of_group[inverse.reshape(-1)]
