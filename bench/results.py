"""The run directory: ``results.csv`` (one row per (case, pass), appended and flushed per
case), ``env.json`` (the environment) and a loader returning a pandas DataFrame.

Rows of one case are written together, so a killed sweep leaves whole cases; a torn last
line (killed mid-write) is dropped by :func:`read_rows` and the file rewritten on resume.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

RESULTS_FILE = "results.csv"
ENV_FILE = "env.json"
STATUSES = ("ok", "oom", "unsupported", "timeout", "error", "skipped")
COLUMNS = [
    "case_id", "label", "variant", "kernel_requested", "kernel", "kernel_path", "params",
    "seq_len", "batch", "heads", "head_dim", "dtype", "device", "causal", "pass", "status",
    "reason", "time_ms", "time_iqr_ms", "repeats", "first_call_ms", "compile_ms",
    "peak_mem_bytes", "flops", "flops_kind", "density", "tflops", "peak_fraction",
    "mask_emulated", "fallback", "threads", "device_name", "torch_version", "xformers_version",
    "git_sha", "timestamp",
]


def git_sha() -> str:
    """The commit of the working tree (``+dirty`` when it has changes), or ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty.strip() else "")) if sha else "unknown"


def environment(device: str, threads: int | None) -> dict[str, Any]:
    """Versions, device name, threads and time stamp of this run."""
    import torch

    try:
        from importlib.metadata import version

        xformers = version("xformers")
    except Exception:
        xformers = ""
    if device == "cuda" and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    device_name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {
        "git_sha": git_sha(), "torch_version": torch.__version__, "xformers_version": xformers,
        "device": device, "device_name": device_name,
        "threads": threads or torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_env(run_dir: Path, env: dict[str, Any]) -> None:
    (run_dir / ENV_FILE).write_text(json.dumps(env, indent=2) + "\n")


def read_rows(run_dir: Path) -> list[dict[str, str]]:
    """Complete rows of ``results.csv`` (a torn last line is dropped)."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # killed mid-write
    rows = list(csv.DictReader(lines))
    return [r for r in rows if r.get("timestamp")]  # the last column: the row is whole


class ResultsWriter:
    """Appends rows to ``results.csv``, flushing and fsyncing after each case."""

    def __init__(self, run_dir: Path, rows: list[dict[str, Any]] | None = None) -> None:
        self.path = Path(run_dir) / RESULTS_FILE
        if rows is not None:  # rewrite (resume): keep only whole cases, atomically
            tmp = self.path.with_suffix(".tmp")
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
            os.replace(tmp, self.path)
        elif not self.path.exists():
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writeheader()

    def append(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """The results of a run directory as a DataFrame (typed columns, one row per case and pass)."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    if not rows and not (run_dir / RESULTS_FILE).exists():
        raise FileNotFoundError(f"no {RESULTS_FILE} in {run_dir}")
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("seq_len", "batch", "heads", "head_dim", "threads"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in ("time_ms", "time_iqr_ms", "repeats", "first_call_ms", "compile_ms",
                "peak_mem_bytes", "flops", "density", "tflops", "peak_fraction"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("causal", "mask_emulated"):
        df[col] = df[col].map({"True": True, "False": False, True: True, False: False})
    for col in ("reason", "fallback", "kernel_path", "flops_kind", "xformers_version"):
        df[col] = df[col].fillna("")
    return df
