"""Markdown report of a run: scaling table per pass plus median times and memory by N."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench.results import load_results
from bench.scaling import scaling_table

REPORT_FILE = "report.md"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table of ``df`` (index ignored)."""
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _pivot(df: pd.DataFrame, value: str, scale: float) -> pd.DataFrame:
    ok = df[df.status == "ok"].copy()
    ok[value] = ok[value] / scale
    table = ok.pivot_table(index=["label", "kernel_requested"], columns="seq_len", values=value,
                           aggfunc="min")
    table.columns = [f"N={c}" for c in table.columns]
    return table.reset_index()


def _config_fit_ranges(run_dir: Path) -> tuple[tuple[int, int], ...]:
    """``fit_ranges`` of the sweep config saved in the run (``sweep.json``), if any."""
    import json

    saved = run_dir / "sweep.json"
    if not saved.exists():
        return ()
    return tuple((int(lo), int(hi)) for lo, hi in json.loads(saved.read_text()).get("fit_ranges", []))


def build_report(run_dir: str | Path, points: int = 4,
                 fit_ranges: tuple[tuple[int, int], ...] = ()) -> str:
    """The report of ``run_dir`` as markdown (also written to ``report.md`` there).

    Besides the fit over the ``points`` largest N, exponents are fitted over each ``[lo, hi]``
    of ``fit_ranges`` and of the run's config (``fit_ranges:`` in the YAML).
    """
    run_dir = Path(run_dir)
    df = load_results(run_dir)
    parts = [f"# Benchmark report: {run_dir.name}", ""]
    env = run_dir / "env.json"
    if env.exists():
        import json

        info = json.loads(env.read_text())
        parts += ["Environment: " + ", ".join(f"{k}=`{v}`" for k, v in info.items()), ""]
    counts = df.groupby("status").size().to_dict()
    parts += ["Rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    table = scaling_table(df, points)
    columns = ["label", "kernel_requested", "kernel", "causal", "time_exponent",
               "memory_exponent", "fit_range", "max_n", "time_ms_at_max_n", "peak_fraction_at_max_n",
               "first_failure", "crossover_vs_full", "mask_emulated"]
    ranges = tuple(dict.fromkeys((*_config_fit_ranges(run_dir), *fit_ranges)))
    for pass_name in ("fwd", "bwd", "fwd_bwd"):
        part = table[table["pass"] == pass_name]
        if part.empty:
            continue
        parts += [f"## Scaling, pass `{pass_name}` (fit over the {points} largest ok N)", "",
                  markdown_table(part[columns]), ""]
        for lo, hi in ranges:
            ranged = scaling_table(df[df["pass"] == pass_name], n_range=(lo, hi))
            ranged = ranged[ranged.fit_points >= 2]
            if len(ranged):
                parts += [f"### Exponents over N = {lo}..{hi}, `{pass_name}`", "",
                          markdown_table(ranged[["label", "kernel_requested", "kernel", "causal",
                                                 "time_exponent", "memory_exponent", "fit_range",
                                                 "fit_points"]]), ""]
        rows = df[df["pass"] == pass_name]
        parts += [f"### Median time (ms), `{pass_name}`", "", markdown_table(_pivot(rows, "time_ms", 1)), ""]
        parts += [f"### Peak memory above inputs (MiB), `{pass_name}`", "",
                  markdown_table(_pivot(rows, "peak_mem_bytes", 2**20)), ""]
    problems = df[~df.status.isin(["ok"])]
    if len(problems):
        slim = problems[["label", "kernel_requested", "seq_len", "pass", "status", "reason"]]
        parts += ["## Rows that did not run", "", markdown_table(slim.drop_duplicates()), ""]
    text = "\n".join(parts)
    (run_dir / REPORT_FILE).write_text(text + "\n")
    return text
