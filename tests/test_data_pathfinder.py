"""bench.quality.data.pathfinder: labels correct by construction, determinism, caching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import pathfinder


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    return pathfinder.generate(300, seed=0, return_meta=True)


def test_shapes_and_balance(sample: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]) -> None:
    images, labels, meta = sample
    assert images.shape == (300, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (300,) and labels.dtype == np.int64
    assert labels.sum() == 150 and set(np.unique(labels).tolist()) == {0, 1}
    assert meta["paths"].shape == (300, 32, 32) and meta["dots"].shape == (300, 2, 2)


def test_labels_by_construction(sample: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]) -> None:
    images, labels, meta = sample
    paths, dots = meta["paths"], meta["dots"]
    rows = np.arange(len(labels))
    # Bookkeeping: the first dot is on path 0; the second on path 0 iff positive.
    assert np.all(paths[rows, dots[:, 0, 0], dots[:, 0, 1]] == 0)
    second = paths[rows, dots[:, 1, 0], dots[:, 1, 1]]
    assert np.array_equal(second == 0, labels == 1)
    assert np.all(second[labels == 0] == 1)
    # Flood fill over the undashed paths of all paths: connected exactly for positives, so no
    # chain of touching paths joins the dots of a negative.
    assert np.array_equal(pathfinder.dots_connected(paths, dots), labels == 1)
    # Every path is drawn, the drawing lies on the bookkeeping, and the dashes leave gaps.
    assert all(len(np.unique(p)) == 1 + 2 + pathfinder.default_params(32)["num_distractors"] for p in paths)
    assert np.all(paths[images > 0] >= 0)
    assert ((paths >= 0) & (images == 0)).any(axis=(1, 2)).all()


def test_dashes_break_pixel_connectivity(sample: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]) -> None:
    images, labels, meta = sample
    drawn = pathfinder.dots_connected(images > 0, meta["dots"])
    assert not drawn[labels == 0].any()
    assert drawn[labels == 1].mean() < 0.2  # the gaps: following lit pixels alone rarely joins the dots


def test_flood_fill_checker_on_handmade_masks() -> None:
    mask = np.zeros((2, 5, 5), dtype=bool)
    mask[:, 0, 0] = mask[:, 1, 1] = mask[:, 2, 2] = True  # diagonal: 8-connected
    mask[1, 1, 1] = False
    dots = np.array([[[0, 0], [2, 2]]] * 2)
    assert pathfinder.dots_connected(mask, dots).tolist() == [True, False]


def test_determinism_and_parameters() -> None:
    a, la = pathfinder.generate(40, seed=7)
    b, lb = pathfinder.generate(40, seed=7)
    c, _ = pathfinder.generate(40, seed=8)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    assert not np.array_equal(a, c)
    images, labels, meta = pathfinder.generate(
        20, seed=1, size=48, num_distractors=2, path_length=(10, 12), dash=2, gap=2, return_meta=True
    )
    assert images.shape == (20, 48, 48)
    assert np.array_equal(pathfinder.dots_connected(meta["paths"], meta["dots"]), labels == 1)
    with pytest.raises(ValueError, match="path_length"):
        pathfinder.generate(2, seed=0, path_length=(10, 5))
    with pytest.raises(ValueError, match="size"):
        pathfinder.generate(2, seed=0, size=4)
    with pytest.raises(ValueError, match=r"^dash: must be a number >= 1; got 0$"):
        pathfinder.generate(2, seed=0, dash=0)
    with pytest.raises(ValueError, match=r"^num_distractors: must be an integer >= 0; got 1.5$"):
        pathfinder.generate(2, seed=0, num_distractors=1.5)


def test_load_or_generate_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTN_BENCH_CACHE", str(tmp_path))
    images, labels = pathfinder.load_or_generate(30, seed=3, num_distractors=2)
    direct, direct_labels = pathfinder.generate(30, seed=3, num_distractors=2)
    assert np.array_equal(images, direct) and np.array_equal(labels, direct_labels)
    real_generate = pathfinder.generate
    monkeypatch.setattr(pathfinder, "generate", lambda *a, **k: pytest.fail("cache miss"))
    hit, hit_labels = pathfinder.load_or_generate(30, seed=3, num_distractors=2)
    assert np.array_equal(images, hit) and np.array_equal(labels, hit_labels)
    assert len(list(tmp_path.glob("pathfinder-*.npz"))) == 1
    # A parameter change or a new generator version regenerates into a new file.
    monkeypatch.setattr(pathfinder, "generate", real_generate)
    pathfinder.load_or_generate(30, seed=3, num_distractors=1)
    monkeypatch.setattr(pathfinder, "VERSION", pathfinder.VERSION + 1)
    pathfinder.load_or_generate(30, seed=3, num_distractors=2)
    assert len(list(tmp_path.glob("pathfinder-*.npz"))) == 3
    with pytest.raises(ValueError, match="unknown pathfinder parameters"):
        pathfinder.load_or_generate(30, seed=3, wiggle=2)
