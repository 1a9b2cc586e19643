"""Raw bytes of an English Wikipedia XML dump excerpt, for byte-level language modelling.

gensim ships ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`` in its
test data (about 1.7 MB compressed, 6.1 MB of text). Like enwik8, the bytes are the raw XML
dump (markup included). The file is located with :func:`importlib.util.find_spec` without
importing gensim (which is slow) and decompressed with :mod:`bz2`.
"""

from __future__ import annotations

import bz2
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attn.validation import invalid
from bench.quality.data.errors import DataMissingError

FILE_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
INSTALL_COMMAND = "pip install gensim"
_WHAT = "enwiki: the Wikipedia excerpt in gensim's test data (PyPI package gensim)"


def data_path() -> Path:
    """Path of the compressed excerpt inside the installed gensim package.

    Raises DataMissingError if gensim (or its test data) is not installed.
    """
    spec = importlib.util.find_spec("gensim")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / "test" / "test_data" / FILE_NAME
        if candidate.is_file():
            return candidate
    raise DataMissingError(_WHAT, INSTALL_COMMAND)


def load_bytes(path: str | Path | None = None) -> np.ndarray:
    """The whole decompressed excerpt as a uint8 array of shape ``(6_089_746,)`` (about 6.1 MB).

    ``path`` overrides the location of the ``.bz2`` file. Raises DataMissingError when it is
    absent, ValueError when it is not valid bzip2 data.
    """
    source = data_path() if path is None else Path(path)
    if not source.is_file():
        raise DataMissingError(_WHAT, INSTALL_COMMAND, detail=f"{source} not found")
    try:
        raw = bz2.decompress(source.read_bytes())
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{source}: corrupt bzip2 file ({err})") from err
    return np.frombuffer(raw, dtype=np.uint8).copy()


def split_by_position(data: np.ndarray, fractions: Sequence[float] = (0.9, 0.05, 0.05)) -> dict[str, np.ndarray]:
    """Cut a 1-D array into contiguous ``"train"``, ``"val"``, ``"test"`` ranges, in that order.

    Sizes are ``floor(fraction * len)`` for train and val, the rest for test; the three parts
    do not overlap and together cover ``data``. The values are views into ``data``.
    """
    data = np.asarray(data)
    if data.ndim != 1:
        raise invalid("data", f"must be one-dimensional; got shape {data.shape}")
    shares = np.asarray(fractions, dtype=np.float64)
    if shares.shape != (3,) or np.any(shares < 0) or not np.isclose(shares.sum(), 1.0, atol=1e-6):
        raise invalid(
            "fractions", f"must be three non-negative numbers (train, val, test) summing to 1; got {fractions!r}"
        )
    n = data.shape[0]
    end_train = int(np.floor(shares[0] * n))
    end_val = min(n, end_train + int(np.floor(shares[1] * n)))
    return {"train": data[:end_train], "val": data[end_train:end_val], "test": data[end_val:]}
