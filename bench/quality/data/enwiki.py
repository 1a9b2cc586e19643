"""Raw bytes of the English Wikipedia XML excerpt (markup included, like enwik8; 6.1 MB) in gensim's test data,
found without importing gensim (which is slow)."""

from __future__ import annotations

import bz2
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attn.validation import invalid
from bench.quality.data.errors import DataMissingError
from bench.quality.data.splits import check_fractions

FILE_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
INSTALL_COMMAND = "pip install gensim"
_WHAT = "enwiki: the Wikipedia excerpt in gensim's test data (PyPI package gensim)"


def data_path() -> Path:
    """Path of the compressed excerpt inside the installed gensim package (``DataMissingError`` without it)."""
    spec = importlib.util.find_spec("gensim")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / "test" / "test_data" / FILE_NAME
        if candidate.is_file():
            return candidate
    raise DataMissingError(_WHAT, INSTALL_COMMAND)


def load_bytes(path: str | Path | None = None) -> np.ndarray:
    """The whole decompressed excerpt (or the ``.bz2`` file at ``path``) as a uint8 array ``(6_089_746,)``."""
    source = data_path() if path is None else Path(path)
    if not source.is_file():
        raise DataMissingError(_WHAT, INSTALL_COMMAND, detail=f"{source} not found")
    try:
        raw = bz2.decompress(source.read_bytes())
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{source}: corrupt bzip2 file ({err})") from err
    return np.frombuffer(raw, dtype=np.uint8).copy()


def split_by_position(data: np.ndarray, fractions: Sequence[float] = (0.9, 0.05, 0.05)) -> dict[str, np.ndarray]:
    """Views of ``data`` cut into contiguous ``"train"``, ``"val"``, ``"test"`` ranges: ``floor(fraction * len)``
    for train and val, the rest for test."""
    data = np.asarray(data)
    if data.ndim != 1:
        raise invalid("data", f"must be one-dimensional; got shape {data.shape}")
    shares = check_fractions(fractions, normalise=False)
    n = data.shape[0]
    end_train = int(np.floor(shares[0] * n))
    end_val = min(n, end_train + int(np.floor(shares[1] * n)))
    return {"train": data[:end_train], "val": data[end_train:end_val], "test": data[end_val:]}
