"""Comparing two runs: time ratio B/A on matching ok rows, and regression detection."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.results import load_results

KEY = ["label", "kernel_requested", "seq_len", "batch", "heads", "head_dim", "dtype", "device",
       "causal", "pass"]


def compare_runs(run_a: str | Path, run_b: str | Path) -> pd.DataFrame:
    """Matching ok rows of two runs with ``time_a_ms``, ``time_b_ms`` and ``change_pct``
    (positive = B slower), plus peak memory of both."""
    a = load_results(run_a)
    b = load_results(run_b)
    cols = [*KEY, "kernel", "time_ms", "peak_mem_bytes"]
    a = a[a.status == "ok"][cols].drop_duplicates(KEY)
    b = b[b.status == "ok"][cols].drop_duplicates(KEY)
    merged = a.merge(b, on=KEY, suffixes=("_a", "_b"))
    merged = merged.rename(columns={"time_ms_a": "time_a_ms", "time_ms_b": "time_b_ms",
                                    "peak_mem_bytes_a": "mem_a_bytes",
                                    "peak_mem_bytes_b": "mem_b_bytes"})
    merged["change_pct"] = (merged.time_b_ms / merged.time_a_ms - 1.0) * 100.0
    return merged.sort_values(["label", "kernel_requested", "pass", "seq_len"]).reset_index(drop=True)


def regressions(table: pd.DataFrame, max_pct: float) -> pd.DataFrame:
    """Rows of a comparison that got slower by more than ``max_pct`` percent."""
    return table[table.change_pct > max_pct]
