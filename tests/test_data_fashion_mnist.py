"""bench.quality.data.fashion_mnist: IDX parsing of the Debian package's Fashion-MNIST files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import fashion_mnist
from bench.quality.data.errors import DataMissingError


@pytest.mark.parametrize(("split", "n"), [("train", 60_000), ("test", 10_000)])
def test_load_split(split: str, n: int) -> None:
    images, labels = fashion_mnist.load(split)
    assert images.shape == (n, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert np.bincount(labels, minlength=10).tolist() == [n // 10] * 10
    assert images.max() == 255 and images.min() == 0
    seq = fashion_mnist.to_sequences(images[:3])
    assert seq.shape == (3, 784) and seq.dtype == np.int64
    np.testing.assert_array_equal(seq[1], images[1].ravel())


def test_first_training_labels() -> None:
    _, labels = fashion_mnist.load("train")
    assert labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="train.*test"):
        fashion_mnist.load("validation")


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataMissingError) as info:
        fashion_mnist.load("test", directory=tmp_path / "nowhere")
    assert "\n" not in str(info.value)
    assert "`apt-get install -y dataset-fashion-mnist`" in str(info.value)


def _write(path: Path, raw: bytes) -> None:
    with gzip.open(path, "wb") as handle:
        handle.write(raw)


def test_parse_idx_and_corrupt_files(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = struct.pack(">IIII", 0x803, 2, 3, 4) + images.tobytes()
    np.testing.assert_array_equal(fashion_mnist.parse_idx(raw, expected_magic=0x803), images)
    with pytest.raises(ValueError, match="magic"):
        fashion_mnist.parse_idx(raw, expected_magic=0x801)
    with pytest.raises(ValueError, match="corrupt"):
        fashion_mnist.parse_idx(raw[:-1], expected_magic=0x803)
    # A directory with a truncated image file and a label file with the wrong magic.
    _write(tmp_path / "t10k-images-idx3-ubyte.gz", raw[:-5])
    _write(tmp_path / "t10k-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, 2) + bytes([1, 2]))
    with pytest.raises(ValueError, match="corrupt"):
        fashion_mnist.load("test", directory=tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="corrupt"):
        fashion_mnist.load("test", directory=tmp_path)
    _write(tmp_path / "t10k-images-idx3-ubyte.gz", raw)
    loaded, labels = fashion_mnist.load("test", directory=tmp_path)
    np.testing.assert_array_equal(loaded, images)
    assert labels.tolist() == [1, 2]
