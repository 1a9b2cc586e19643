"""bench.quality.data.errors and bench.quality.data.cache: one-line errors, cache location, atomic npz cache."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import cache
from bench.quality.data.errors import DataMissingError


def test_data_missing_error_is_one_line_and_picklable() -> None:
    err = DataMissingError("text: the corpus\n(package x)", "pip install x", detail="looked in\n/nowhere")
    assert isinstance(err, RuntimeError)
    assert "\n" not in str(err)
    assert "`pip install x`" in str(err)
    assert err.install_command == "pip install x"
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, DataMissingError)
    assert str(back) == str(err) and back.install_command == "pip install x"


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTN_BENCH_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == (tmp_path / "explicit").resolve()
    assert (tmp_path / "explicit").is_dir()
    monkeypatch.delenv("ATTN_BENCH_CACHE")
    assert cache.cache_dir() == (tmp_path / "xdg" / "attn-bench").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == (tmp_path / "home" / ".cache" / "attn-bench").resolve()


def test_cache_dir_refuses_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(cache.__file__).resolve().parents[3]
    if not (repo / ".git").exists():
        pytest.skip("not running from a git checkout")
    monkeypatch.setenv("ATTN_BENCH_CACHE", str(repo / "cache-here"))
    with pytest.raises(ValueError, match="ATTN_BENCH_CACHE"):
        cache.cache_dir()
    assert not (repo / "cache-here").exists()


def test_load_or_generate_npz_hits_misses_and_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTN_BENCH_CACHE", str(tmp_path))
    calls: list[int] = []

    def make(value: int):
        def generate() -> dict[str, np.ndarray]:
            calls.append(value)
            return {"x": np.arange(5) * value, "y": np.ones((2, 2), dtype=np.uint8)}

        return generate

    first = cache.load_or_generate_npz("toy", {"a": 1, "b": (2, 3)}, 1, make(1))
    again = cache.load_or_generate_npz("toy", {"b": (2, 3), "a": 1}, 1, make(99))  # same key, other order
    assert calls == [1]
    np.testing.assert_array_equal(first["x"], again["x"])
    assert again["y"].dtype == np.uint8 and set(again) == {"x", "y"}
    cache.load_or_generate_npz("toy", {"a": 2, "b": (2, 3)}, 1, make(2))  # parameter change
    cache.load_or_generate_npz("toy", {"a": 1, "b": (2, 3)}, 2, make(3))  # version change
    assert calls == [1, 2, 3]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 3 and all(f.startswith("toy-") and f.endswith(".npz") for f in files)


def test_load_or_generate_npz_regenerates_a_corrupt_file(tmp_path: Path) -> None:
    params = {"n": 3}
    path = tmp_path / f"toy-{cache.params_hash('toy', params, 1)}.npz"
    path.write_bytes(b"not a zip file")
    out = cache.load_or_generate_npz("toy", params, 1, lambda: {"x": np.arange(3)}, directory=tmp_path)
    np.testing.assert_array_equal(out["x"], np.arange(3))
    with np.load(path) as npz:
        np.testing.assert_array_equal(npz["x"], np.arange(3))
    assert not list(tmp_path.glob("*.tmp"))
