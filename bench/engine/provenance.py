"""Where a number came from: the code version, the installed package and the machine.

A non-editable install has no checkout of its own: a git repository that happens to enclose the
environment is never read, and the package version stands for the code.
"""

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

from bench.engine.allocator import allocator_settings
from bench.engine.cache import INDUCTOR_VAR, compile_cache_dir

DISTRIBUTION = "attn-bench"
#: tracked paths whose changes do not change the code version (results, docs, tests)
NOT_CODE = ("results", "docs", "tests", ".ci", ":(glob)**/*.md")  # git pathspecs


def source_root() -> Path | None:
    """The source checkout the running package comes from, or None (installed package)."""
    root = Path(__file__).resolve().parents[2]  # bench/engine/provenance.py
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or f'name = "{DISTRIBUTION}"' not in pyproject.read_text():
        return None
    return root


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
    """``<sha>`` (the last commit that changed code, not :data:`NOT_CODE`) or ``<sha>+dirty``; else
    ``not a git checkout``."""
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


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: instruction-set flags of /proc/cpuinfo that decide which CPU kernels torch and its BLAS run
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_identity() -> dict[str, str]:
    """The CPU a run's figures hold for: model, vendor, torch's dispatch level, :data:`CPU_FLAGS` and BLAS."""
    import torch

    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown")
    return {"cpu_model": cpu_name(), "cpu_vendor": fields.get("vendor_id", platform.machine()),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": " ".join(f for f in CPU_FLAGS if f in flags), "blas": blas}


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

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_name()


def command_line() -> str:
    """This process's command as a shell would take it (``python -m PACKAGE`` for a package run with ``-m``)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    words = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*words, *sys.argv[1:]])


def environment(device: str, threads: int | None, *, probe: bool = True) -> dict[str, Any]:
    """Versions, device, threads, allocator, host, CPU, time stamp and command line of this run. ``probe``
    False: the device is not on this machine (a cluster's driver): CUDA is not asked."""
    import torch

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
