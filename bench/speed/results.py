"""A speed sweep's results as a pandas DataFrame: typed columns, one row per case and pass,
labels as they are written now (:func:`load_results`; :mod:`bench.engine.results` reads the
file, checking every row against its schema)."""

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


def load_results(run_dir: str | Path, *, damaged: bool = False) -> pd.DataFrame:
    """The results of a run directory as a DataFrame (typed columns, one row per case and pass).

    ``noisy`` is a bool of every row (:func:`bench.speed.noise.noisy_flags`): the recorded
    flag, or for a row written before the flag, what its repeats' spread says.

    Damaged rows are left out (with a :class:`DamagedRowWarning`); with ``damaged`` they are
    kept, with what is wrong in the column ``problem`` (empty for valid rows), so that a
    comparison can call them broken instead of losing them.
    """
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).exists():
        raise FileNotFoundError(f"no {RESULTS_FILE} in {run_dir}")
    read = read_table(run_dir)
    warn_rejected(read, "counted as broken" if damaged else "left out")
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
                "interleave_id", "problem", "probe_ms"):
        df[col] = df[col].astype(object).where(df[col].notna(), "")
    df["noisy"] = noisy_flags(df)  # rows written before the flag: judged by their spread
    df["packing"] = df["packing"].astype(object).where(df["packing"].notna(), "")
    df["label"] = [_packed_label(row.variant, row.params, row.label, row.packing) for row in df.itertuples()]
    return df


def _packed_label(variant: Any, params: Any, recorded: Any, packing: str) -> Any:
    """:func:`_label` of a row whose label ends with its packing (``full [packed 8 docs]``,
    :mod:`bench.speed.packing`), the packing kept."""
    suffix = f" [{packing}]" if packing else ""
    if not suffix or not str(recorded).endswith(suffix):
        return _label(variant, params, recorded)
    return f"{_label(variant, params, str(recorded)[: -len(suffix)])}{suffix}"


def _label(variant: Any, params: Any, recorded: Any) -> Any:
    """The label of a row as :func:`bench.engine.labels.variant_label` writes it now (every pattern
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
