"""Fashion-MNIST (Xiao et al. 2017: 60,000 training and 10,000 test images, 28x28 grey levels, 10 classes) from
the gzip-compressed IDX files the Debian package ``dataset-fashion-mnist`` installs."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from attn.validation import invalid, require_choice
from bench.quality.data.errors import DataMissingError

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_COMMAND = "apt-get install -y dataset-fashion-mnist"
SPLITS: dict[str, str] = {"train": "train", "test": "t10k"}
#: Class names in label order.
CLASSES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
IMAGE_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABEL_MAGIC = 0x00000801  # unsigned byte, 1 dimension


def parse_idx(raw: bytes, *, expected_magic: int, name: str = "IDX data") -> np.ndarray:
    """An uncompressed IDX byte string of unsigned bytes as a uint8 array, magic and size checked."""
    if len(raw) < 4:
        raise ValueError(f"{name}: corrupt IDX file (only {len(raw)} bytes)")
    (magic,) = struct.unpack(">I", raw[:4])
    if magic != expected_magic:
        raise ValueError(f"{name}: corrupt IDX file (magic 0x{magic:08x}, expected 0x{expected_magic:08x})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{name}: corrupt IDX file (truncated header)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise ValueError(
            f"{name}: corrupt IDX file (header says shape {shape} = {expected} bytes, found {len(raw) - header})"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()


def _read_gz(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: corrupt gzip file ({err})") from err


def load(split: str, *, directory: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(images (n, 28, 28) uint8, labels (n,) int64)`` of ``"train"`` or ``"test"``."""
    require_choice("split", split, SPLITS)
    root = DEFAULT_DIR if directory is None else Path(directory)
    prefix = SPLITS[split]
    image_path = root / f"{prefix}-images-idx3-ubyte.gz"
    label_path = root / f"{prefix}-labels-idx1-ubyte.gz"
    missing = [p.name for p in (image_path, label_path) if not p.is_file()]
    if missing:
        raise DataMissingError(
            "fashion_mnist: the Fashion-MNIST IDX files (Debian package dataset-fashion-mnist)",
            INSTALL_COMMAND,
            detail=f"missing {', '.join(missing)} in {root}",
        )
    images = parse_idx(_read_gz(image_path), expected_magic=IMAGE_MAGIC, name=str(image_path))
    labels = parse_idx(_read_gz(label_path), expected_magic=LABEL_MAGIC, name=str(label_path))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{root}: {split} has {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and labels.max() >= len(CLASSES):
        raise ValueError(f"{label_path}: label {int(labels.max())} out of range 0..{len(CLASSES) - 1}")
    return images, labels.astype(np.int64)


def to_sequences(images: np.ndarray) -> np.ndarray:
    """Images ``(n, h, w)`` flattened row-major into grey-level token sequences ``(n, h*w)`` (no mask)."""
    images = np.asarray(images)
    if images.ndim != 3:
        raise invalid("images", f"must have shape (n, height, width); got {images.shape}")
    return images.reshape(images.shape[0], -1).astype(np.int64)
