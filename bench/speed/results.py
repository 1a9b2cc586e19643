"""A speed sweep's results as a typed DataFrame, one row per case and pass, labels as they are written now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from bench.engine.labels import variant_label
from bench.engine.results import RESULTS_FILE, read_table, warn_rejected
from bench.engine.row_schema import COLUMNS
from bench.speed.noise import noisy_flags

NUMERIC = ("time_ms", "time_iqr_ms", "repeats", "estimate_ms", "first_call_ms", "compile_ms", "compile_bwd_ms",
           "setup_ms", "setup_mem_bytes", "peak_mem_bytes", "rss_peak_bytes", "flops", "density",
           "tflops", "peak_fraction", "interleaved", "time_spread", "noise_threshold")


def load_results(run_dir: str | Path, *, damaged: bool = False, rows_required: bool = False) -> pd.DataFrame:
    """The results of a run directory; damaged rows left out, or with ``damaged`` kept and said in ``problem``."""
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).exists():
        raise FileNotFoundError(f"no {RESULTS_FILE} in {run_dir}")
    read = read_table(run_dir)
    warn_rejected(read, "counted as broken" if damaged else "left out")
    if rows_required and not read.rows:
        raise ValueError(f"RUN_DIR {run_dir}: results.csv has no result rows yet (header only); "
                         "run or resume the sweep first")
    records = [{**row, "problem": ""} for row in read.rows]
    if damaged:
        records += [{**bad.row, "problem": bad.problem} for bad in read.rejected if bad.row]
    df = pd.DataFrame(records, columns=[*COLUMNS, "problem"])
    for col in ("seq_len", "batch", "heads", "head_dim", "threads", "kv_heads"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    df["kv_heads"] = df["kv_heads"].fillna(df["heads"])  # rows written before the column: H_kv = H
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("causal", "mask_emulated", "noisy"):
        df[col] = df[col].map({"True": True, "False": False, True: True, False: False})
    for col in ("reason", "fallback", "kernel_path", "flops_kind", "xformers_version", "times_ms",
                "interleave_id", "problem", "probe_ms", "packing"):
        df[col] = df[col].astype(object).where(df[col].notna(), "")
    df["noisy"] = noisy_flags(df)  # rows written before the flag: judged by their spread
    df["label"] = [_packed_label(row.variant, row.params, row.label, row.packing) for row in df.itertuples()]
    return df


def _packed_label(variant: Any, params: Any, recorded: Any, packing: str) -> Any:
    """:func:`_label` of a row whose label may end with its packing (``full [packed 8 docs]``), the packing kept."""
    suffix = f" [{packing}]" if packing else ""
    if not suffix or not str(recorded).endswith(suffix):
        return _label(variant, params, recorded)
    return f"{_label(variant, params, str(recorded)[: -len(suffix)])}{suffix}"


def _label(variant: Any, params: Any, recorded: Any) -> Any:
    """The label as :func:`bench.engine.labels.variant_label` writes it now (older runs match newer), if it can."""
    try:
        parsed = json.loads(params) if isinstance(params, str) and params else {}
    except ValueError:
        return recorded
    if not isinstance(variant, str) or not variant or not isinstance(parsed, dict):
        return recorded
    if not (recorded == variant or str(recorded).startswith(f"{variant}(")):
        return recorded  # a label of the caller's own, not one written from the variant
    return variant_label(variant, parsed)
