"""Where a number came from: the code version, the installed package and the machine.

The code version is the git commit of the source checkout the package runs from, with
``+dirty`` when tracked files other than committed results (``results/``) differ from it:
rerunning a committed result set rewrites its own CSV, which must not mark the code as
changed. A non-editable install (the package inside a virtual environment's
site-packages) has no checkout of its own; the git repository that happens to enclose the
environment is never read, and the installed package version stands for the code.
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
#: tracked paths whose changes (committed or not) do not change the code version: what is
#: measured depends on the package and its configs, not on results, docs or the tests
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
    """``<sha>`` or ``<sha>+dirty`` of the source checkout; ``not a git checkout`` otherwise.

    ``<sha>`` is the last commit that changed code (anything but :data:`NOT_CODE`), so
    committing results or docs mid-sweep does not make a resumed sweep look like other code;
    ``+dirty``: a tracked code file differs from it.
    """
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
    """The CPU a run's figures hold for: model, vendor, the instruction sets its kernels use
    (torch's dispatch level, ``torch.backends.cpu.get_cpu_capability()``, and the flags of
    :data:`CPU_FLAGS` the CPU has) and torch's BLAS. A ratio measured on one CPU kind can
    move 3x on another (docs/measurement.md)."""
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
    """The name of this machine's ``device``: the (first visible) GPU's for ``cuda`` where
    CUDA is available, else the CPU model."""
    import torch  # here, not at import: the history of the results files needs no torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_name()


def command_line() -> str:
    """The command this process runs, as a shell would take it (``attn-bench sweep quick
    --out runs/quick``): the program's file name (``python -m PACKAGE`` for a package run
    with ``-m``), then its arguments."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    words = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*words, *sys.argv[1:]])


def environment(device: str, threads: int | None, *, probe: bool = True) -> dict[str, Any]:
    """Versions, device name, threads, allocator settings (:mod:`bench.engine.allocator`), host,
    the CPU (:func:`cpu_identity`), time stamp and command line of this run. ``probe`` False: the
    device is not on this machine (a cluster's driver), so CUDA is not asked and the name is
    this machine's CPU model."""
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
