"""The run directory of a speed sweep: ``results.csv`` (one row per (case, pass), appended and
fsynced per unit), ``env.json`` (the environment of each run segment) and a loader returning
a pandas DataFrame.

Rows of one unit are written together, so a killed sweep leaves whole units. On resume the
file is read back leniently and rewritten atomically with only whole rows: a torn last line,
a torn first line, a missing or torn header, or an empty file are all repaired.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from bench.fsutil import atomic_write_json, atomic_write_text, read_json
from bench.labels import variant_label
from bench.provenance import ROW_FIELDS

RESULTS_FILE = "results.csv"
ENV_FILE = "env.json"
STATUSES = ("ok", "oom", "killed", "unsupported", "timeout", "error", "skipped")
#: statuses that ``--retry-failed`` measures again
RETRY_STATUSES = ("oom", "killed", "timeout", "error", "skipped")
COLUMNS = [
    "case_id", "label", "variant", "kernel_requested", "kernel", "kernel_path", "params",
    "seq_len", "batch", "heads", "head_dim", "dtype", "device", "causal", "pass", "status",
    "reason", "time_ms", "time_iqr_ms", "repeats", "times_ms", "estimate_ms", "first_call_ms",
    "compile_ms", "setup_ms", "setup_mem_bytes", "peak_mem_bytes", "rss_peak_bytes", "flops",
    "flops_kind", "density", "tflops", "peak_fraction", "mask_emulated", "fallback",
    "interleave_id", "interleaved", "threads", *ROW_FIELDS,
]
NUMERIC = ("time_ms", "time_iqr_ms", "repeats", "estimate_ms", "first_call_ms", "compile_ms",
           "setup_ms", "setup_mem_bytes", "peak_mem_bytes", "rss_peak_bytes", "flops", "density",
           "tflops", "peak_fraction", "interleaved")


def read_rows(run_dir: str | Path, file: str = RESULTS_FILE,
              columns: list[str] = COLUMNS) -> list[dict[str, str]]:
    """Whole rows of a results file: torn or foreign lines are dropped, never glued."""
    path = Path(run_dir) / file
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # killed mid-write
    if not lines or lines[0].rstrip("\r\n").split(",")[0] != columns[0]:
        return []  # no usable header (empty or torn file): nothing whole to keep
    header = next(csv.reader(io.StringIO(lines[0])))
    rows = []
    for record in csv.reader(io.StringIO("".join(lines[1:]))):
        if len(record) != len(header):
            continue  # torn row (or a row glued to a torn one)
        row = dict(zip(header, record))
        if row.get("timestamp") and row.get("status") in STATUSES:
            rows.append(row)
    return rows


def _csv_text(rows: list[dict[str, Any]], header: bool, columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class ResultsWriter:
    """Appends rows to a results file, flushing and fsyncing after each unit.

    ``rows`` given: the file is first rewritten atomically with exactly those rows (resume).
    """

    def __init__(self, run_dir: str | Path, rows: list[dict[str, Any]] | None = None,
                 file: str = RESULTS_FILE, columns: list[str] = COLUMNS) -> None:
        self.path = Path(run_dir) / file
        self.columns = columns
        if rows is not None or not self.path.exists() or self.path.stat().st_size == 0:
            atomic_write_text(self.path, _csv_text(rows or [], True, columns))

    def append(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a", newline="") as f:
            f.write(_csv_text(rows, False, self.columns))
            f.flush()
            os.fsync(f.fileno())


def read_env(run_dir: str | Path) -> list[dict[str, Any]]:
    """The environment of every run segment (one per sweep invocation that wrote rows)."""
    path = Path(run_dir) / ENV_FILE
    if not path.exists():
        return []
    data = read_json(path, what="environment file")
    if isinstance(data, dict) and "segments" in data:
        return list(data["segments"])
    return [data] if isinstance(data, dict) else []


def write_env(run_dir: str | Path, segments: list[dict[str, Any]]) -> None:
    """Write every segment's environment (atomically)."""
    atomic_write_json(Path(run_dir) / ENV_FILE, {"segments": segments})


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """The results of a run directory as a DataFrame (typed columns, one row per case and pass)."""
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).exists():
        raise FileNotFoundError(f"no {RESULTS_FILE} in {run_dir}")
    df = pd.DataFrame(read_rows(run_dir), columns=COLUMNS)
    for col in ("seq_len", "batch", "heads", "head_dim", "threads"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("causal", "mask_emulated"):
        df[col] = df[col].map({"True": True, "False": False, True: True, False: False})
    for col in ("reason", "fallback", "kernel_path", "flops_kind", "xformers_version", "times_ms",
                "interleave_id"):
        df[col] = df[col].fillna("")
    df["label"] = [_label(row.variant, row.params, row.label) for row in df.itertuples()]
    return df


def _label(variant: Any, params: Any, recorded: Any) -> Any:
    """The label of a row as :func:`bench.labels.variant_label` writes it now (every pattern
    parameter, defaults included), so runs recorded before a default was named in labels
    still match newer runs in ``compare``, reports and plots; the recorded one when the
    ``params`` column does not parse or the label is not one written from the variant's name."""
    try:
        parsed = json.loads(params) if isinstance(params, str) and params else {}
    except ValueError:
        return recorded
    if not isinstance(variant, str) or not variant or not isinstance(parsed, dict):
        return recorded
    if not (recorded == variant or str(recorded).startswith(f"{variant}(")):
        return recorded  # a label of the caller's own, not one written from the variant
    return variant_label(variant, parsed)
