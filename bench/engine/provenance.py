"""Where a number came from: the code version, the installed package and the machine."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import socket
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from attn.machine import CPU_FLAGS, cpu_identity, cpu_name
from bench.engine.allocator import allocator_settings
from bench.engine.cache import INDUCTOR_VAR, compile_cache_dir

DISTRIBUTION = "attn-bench"
#: tracked paths whose changes do not change the code version (results, docs, tests)
NOT_CODE = ("results", "docs", "tests", ".ci", ":(glob)**/*.md")  # git pathspecs


def source_root() -> Path | None:
    """The source checkout the running package comes from, or None (installed package)."""
    root = Path(__file__).resolve().parents[2]  # bench/engine/provenance.py
    pyproject = root / "pyproject.toml"
    return root if pyproject.is_file() and f'name = "{DISTRIBUTION}"' in pyproject.read_text() else None


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()


def _exclude(pathspec: str) -> str:
    """``:(exclude)`` of a pathspec, merging magic words (``:(glob)x`` -> ``:(exclude,glob)x``)."""
    if pathspec.startswith(":("):
        magic, rest = pathspec[2:].split(")", 1)
        return f":(exclude,{magic}){rest}"
    return f":(exclude){pathspec}"


@cache
def code_version() -> str:
    """The last commit that changed code (not :data:`NOT_CODE`), ``+dirty``; an installed package never reads git."""
    root = source_root()
    if root is None:
        return "installed package (no source checkout)"
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root:
            return "not a git checkout"
        code = (".", *(_exclude(p) for p in NOT_CODE))
        sha = _git(root, "log", "-1", "--format=%H", "--", *code) or _git(root, "rev-parse", "HEAD")
        changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *code)
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout"
    return sha + ("+dirty" if changed else "")


def package_version() -> str:
    """Version of the installed ``attn-bench`` distribution (``unknown`` if not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def cpu_summary(segment: dict[str, Any]) -> str:
    """One line naming a segment's CPU ("" when it was not recorded)."""
    if not segment.get("cpu_model"):
        return ""
    flags = segment.get("cpu_flags") or "none of " + "/".join(CPU_FLAGS)
    return (f"{segment['cpu_model']} ({segment.get('cpu_vendor', '?')}; torch kernels "
            f"{segment.get('cpu_capability', '?')}; flags {flags}; BLAS {segment.get('blas', '?')})")


def device_name(device: str) -> str:
    """The first visible GPU's name for ``cuda`` where available, else the CPU model."""
    import torch  # here, not at import: the history of the results files needs no torch

    return torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else cpu_name()


def command_line() -> str:
    """This process's command as a shell would take it (``python -m PACKAGE`` for a package run with ``-m``)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    words = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*words, *sys.argv[1:]])


def environment(device: str, threads: int | None, *, probe: bool = True) -> dict[str, Any]:
    """Versions, device, threads, allocator, host, CPU, time and command of this run (``probe`` False: no CUDA)."""
    import torch  # here, not at import: the history of the results files needs no torch

    try:
        xformers = metadata.version("xformers")
    except metadata.PackageNotFoundError:
        xformers = ""
    return {
        "git_sha": code_version(), "package_version": package_version(),
        "torch_version": torch.__version__, "xformers_version": xformers,
        "device": device, "device_name": device_name(device) if probe else cpu_name(),
        "threads": threads or torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "allocator": allocator_settings(), "hostname": socket.gethostname(), **cpu_identity(),
        "compile_cache": os.environ.get(INDUCTOR_VAR) or str(compile_cache_dir(device if probe else "cpu")),
        "python": platform.python_version(), "platform": platform.platform(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
    }


#: environment fields copied onto every result row
ROW_FIELDS = ("git_sha", "package_version", "device_name", "torch_version", "xformers_version",
              "hostname", "timestamp")
#: fields that must match for a resumed run to add rows to an existing one (plus dtype)
RESUME_FIELDS = ("git_sha", "device_name", "threads")
