"""Generated datasets cached as ``.npz`` under :func:`cache_dir` (never in git), keyed by a name and a hash of
every generation parameter and the generator's version, so a change to either makes a new file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attn.validation import invalid
from bench.engine.cache import ENV_VAR, cache_dir

__all__ = ["ENV_VAR", "cache_dir", "load_or_generate_npz", "params_hash"]

_META_KEY = "__cache_meta__"


def params_hash(name: str, params: Mapping[str, Any], version: int | str) -> str:
    """Hex digest (16 chars) of ``name``, JSON-serialisable ``params`` (in any key order) and ``version``."""
    blob = json.dumps({"name": name, "params": params, "version": version}, sort_keys=True, default=_jsonable)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cache parameter of type {type(value).__name__} is not JSON-serialisable")


def load_or_generate_npz(
    name: str,
    params: Mapping[str, Any],
    version: int | str,
    generate: Callable[[], Mapping[str, np.ndarray]],
    *,
    directory: Path | None = None,
) -> dict[str, np.ndarray]:
    """The arrays cached for (name, params, version), or ``generate()``'s, cached atomically as
    ``<directory>/<name>-<hash>.npz`` (no pickled objects are stored or loaded)."""
    if not name or any(c in name for c in "/\\\0"):
        raise invalid("name", f"must be a non-empty file-name-safe string; got {name!r}")
    directory = cache_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"name": name, "params": params, "version": version}, sort_keys=True, default=_jsonable)
    path = directory / f"{name}-{params_hash(name, params, version)}.npz"

    cached = _read(path, meta)
    if cached is not None:
        return cached

    arrays = {key: np.asarray(value) for key, value in generate().items()}
    if _META_KEY in arrays:
        raise ValueError(f"generate() must not return the reserved key {_META_KEY!r}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays, **{_META_KEY: np.array(meta)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return arrays


def _read(path: Path, meta: str) -> dict[str, np.ndarray] | None:
    """Arrays from ``path`` if it exists, is readable and was made with ``meta``; else None."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            if _META_KEY not in npz.files or str(npz[_META_KEY]) != meta:
                return None
            return {key: npz[key] for key in npz.files if key != _META_KEY}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
