"""bench.quality.data.enwiki: the enwiki XML excerpt from gensim's test data, split by position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import enwiki
from bench.quality.data.errors import DataMissingError


def test_load_bytes_and_split() -> None:
    data = enwiki.load_bytes()
    assert data.dtype == np.uint8 and data.shape == (6_089_746,)
    assert bytes(data[:10]) == b"<mediawiki"
    parts = enwiki.split_by_position(data)
    assert list(parts) == ["train", "val", "test"]
    sizes = [len(v) for v in parts.values()]
    assert sum(sizes) == data.size and sizes[0] == int(0.9 * data.size)
    assert np.array_equal(np.concatenate(list(parts.values())), data)  # contiguous, in order, no overlap


def test_split_by_position_validates() -> None:
    parts = enwiki.split_by_position(np.arange(10), fractions=(0.5, 0.3, 0.2))
    assert [p.tolist() for p in parts.values()] == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match="fractions"):
        enwiki.split_by_position(np.arange(10), fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="one-dimensional"):
        enwiki.split_by_position(np.zeros((2, 2)))


def test_missing_gensim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(enwiki.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataMissingError) as info:
        enwiki.load_bytes()
    assert "\n" not in str(info.value) and "`pip install gensim`" in str(info.value)
    with pytest.raises(DataMissingError, match="pip install gensim"):
        enwiki.load_bytes(tmp_path / "missing.bz2")
    (tmp_path / "bad.bz2").write_bytes(b"not bzip2")
    with pytest.raises(ValueError, match="corrupt"):
        enwiki.load_bytes(tmp_path / "bad.bz2")
