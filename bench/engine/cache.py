"""Where the suite keeps what it can rebuild: generated data, dequantised models, the shared compile cache."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

ENV_VAR = "ATTN_BENCH_CACHE"
#: torch Inductor's own setting; a user who sets it keeps their directory
INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"


def _repository_root() -> Path | None:
    """The git work tree holding this package, or None when installed elsewhere."""
    root = Path(__file__).resolve().parents[2]  # bench/engine/cache.py
    return root if (root / ".git").exists() else None


def cache_dir() -> Path:
    """``$ATTN_BENCH_CACHE``, else under ``$XDG_CACHE_HOME`` or ``~/.cache``, created; never in the git work tree."""
    if os.environ.get(ENV_VAR):
        path, source = Path(os.environ[ENV_VAR]), ENV_VAR
    elif os.environ.get("XDG_CACHE_HOME"):
        path, source = Path(os.environ["XDG_CACHE_HOME"]) / "attn-bench", "XDG_CACHE_HOME"
    else:
        path, source = Path.home() / ".cache" / "attn-bench", "HOME"
    path = path.expanduser().resolve()
    repo = _repository_root()
    if repo is not None and path.is_relative_to(repo):
        raise ValueError(f"cache directory {path} (from ${source}) is inside the git repository {repo}; "
                         f"set {ENV_VAR} to a directory outside it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # triton: absent from CPU-only installs
        return "none"


def _device_kind(device: str) -> str:
    """``device``, or the CUDA device's name."""
    if device != "cuda":
        return device
    import torch  # lazy: the parent of a run never imports torch for its provenance

    return torch.cuda.get_device_name() if torch.cuda.is_available() else device


def compile_cache_dir(device: str) -> Path:
    """The Inductor cache of this torch, Triton and device kind, shared by every run on this machine."""
    key = f"torch-{_version('torch')}-triton-{_version('triton')}-{_device_kind(device)}"
    key = re.sub(r"[^A-Za-z0-9.+-]+", "_", key)
    return cache_dir() / "inductor" / key


def use_compile_cache(device: str) -> str:
    """Point compiles at :func:`compile_cache_dir` unless ``TORCHINDUCTOR_CACHE_DIR`` is set; the directory."""
    if not os.environ.get(INDUCTOR_VAR):
        os.environ[INDUCTOR_VAR] = str(compile_cache_dir(device))
    return os.environ[INDUCTOR_VAR]
