"""The markdown report of a speed run: noise, provenance, scaling fits, ratios, times, memory, failures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.engine.config import list_config_presets
from bench.engine.fsutil import atomic_write_text, read_json
from bench.engine.markdown import cell, markdown_table
from bench.engine.results import read_env
from bench.engine.row_schema import SPEED_PASSES
from bench.speed.noise import DEFAULT_THRESHOLD, SLOW_STATE_FACTOR, quiet_probes, row_verdict
from bench.speed.results import load_results
from bench.speed.scaling import scaling_table

REPORT_FILE = "report.md"
#: what the scaling tables' less obvious columns mean, said once above them
COLUMN_LEGEND = (
    "Columns: `peak_fraction_at_max_n` is the case's achieved FLOP rate at its largest ok N "
    "over the peak of a square matmul measured in the same run on the same device (1.0: as "
    "fast as a plain matmul; empty where not measured, e.g. rows from other nodes); "
    "`mask_emulated` is True when any of its ok rows computed the variant's sparse pattern as "
    "a mask over all N x N scores (SDPA with a cached mask, a chunked or reference kernel) "
    "instead of skipping the disallowed pairs: its time then grows as full attention's does, "
    "whatever the pattern saves. `kernel` is the kernel that ran: `auto` switches with N, and "
    "each kernel it ran is fitted on its own row; `noisy_dropped` counts the rows measured "
    "under contention left out of that fit; `crossover_vs_full` is of the whole requested "
    "curve, `not determined` (and why) without two lengths on each side whose spreads do not "
    "overlap full attention's.")
PROVENANCE = ["git_sha", "package_version", "device_name", "threads", "torch_version", "hostname"]


def _pivot(df: pd.DataFrame, cell: pd.Series) -> pd.DataFrame:
    ok = df[df.status == "ok"].assign(cell=cell)
    table = ok.pivot_table(index=["label", "kernel_requested", "heads", "kv_heads"], columns="seq_len",
                           values="cell", aggfunc="first")
    table.columns = [f"N={c}" for c in table.columns]
    return table.reset_index()


def _time_cells(df: pd.DataFrame) -> pd.Series:
    """``median (iqr X, n=R)`` in ms; ``, noisy`` added for a row flagged noisy."""
    return df.apply(lambda r: f"{cell(r.time_ms)} (iqr {cell(r.time_iqr_ms)}, n={cell(r.repeats)}"
                              f"{', noisy' if r.noisy else ''})",
                    axis=1) if len(df) else pd.Series(dtype=str)


def per_round_times(text: str) -> np.ndarray:
    """A row's ``times_ms`` cell as an array, one time per round."""
    return np.asarray(json.loads(text) if text else [], dtype=float)


def _timed_together(df: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` rows timed in interleaved rounds with other rows (``interleaved`` > 1)."""
    return df[(df.status == "ok") & (df.interleaved.fillna(1) > 1)]


def interleaved_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Each kernel's time (and memory) over the fastest one timed in the same rounds: per-round ratio quartiles."""
    rows = []
    ok = _timed_together(df)
    for (_unit, pass_name), group in ok.groupby(["interleave_id", "pass"], sort=False):
        fastest = group.loc[group.time_ms.idxmin()]
        base = per_round_times(fastest.times_ms)
        for row in group.itertuples():
            q50, q25, q75, rounds = round_ratio(per_round_times(row.times_ms), base)
            rows.append({"label": row.label, "pass": pass_name, "seq_len": row.seq_len,
                         "kernel": row.kernel_requested, "kv_heads": row.kv_heads,
                         "vs": (fastest.kernel_requested if group.label.nunique() == 1
                                else f"{fastest.label} {fastest.kernel_requested}"),
                         "vs_kv_heads": fastest.kv_heads,
                         "time_ratio": q50, "ratio_q25": q25, "ratio_q75": q75, "rounds": rounds,
                         "memory_ratio": _memory_ratio(row.peak_mem_bytes, fastest.peak_mem_bytes)})
    return pd.DataFrame(rows)


def _memory_ratio(peak: float, base: float) -> float:
    return peak / base if base and base > 0 else math.nan


def round_ratio(times: np.ndarray, base: np.ndarray) -> tuple[float, float, float, int]:
    """Median and quartiles of the per-round ratios ``times / base``, and the rounds."""
    rounds = min(len(times), len(base))
    if not rounds:
        return math.nan, math.nan, math.nan, 0
    q25, q50, q75 = np.percentile(times[:rounds] / base[:rounds], [25, 50, 75])
    return float(q50), float(q25), float(q75), rounds


def _ratio_cell(ratio: tuple[float, float, float, int] | None) -> str:
    return "" if ratio is None or not ratio[3] else f"{cell(ratio[0])} [{cell(ratio[1])}, {cell(ratio[2])}]"


def flop_rate_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Each row's FLOP rate over the fastest ``full`` row of its rounds (per-round ratio quartiles; docs/kernels.md)."""
    rows = []
    timed = _timed_together(df)
    ok = timed[timed.flops.fillna(0) > 0]
    for (_unit, pass_name), group in ok.groupby(["interleave_id", "pass"], sort=False):
        full = group[group.variant == "full"]
        if full.empty:
            continue
        base = full.loc[full.time_ms.idxmin()]
        base_times = per_round_times(base.times_ms)
        for row in group[group.variant != "full"].itertuples():
            speed, q25, q75, rounds = round_ratio(base_times, per_round_times(row.times_ms))  # full's over the row's
            work = row.flops / base.flops
            rows.append({"label": row.label, "pass": pass_name, "seq_len": row.seq_len,
                         "kernel": row.kernel_requested, "kernel_ran": row.kernel, "flops_kind": row.flops_kind,
                         "vs": f"full {base.kernel_requested}", "rate_ratio": work * speed,
                         "ratio_q25": work * q25, "ratio_q75": work * q75, "rounds": rounds})
    return pd.DataFrame(rows)


def packing_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Packed or padded rows' time over the unpacked row of their rounds (same kernel, else the fastest) and over
    the same documents run one by one: per-round ratios, median [q25, q75]."""
    if "packing" not in df.columns:
        return pd.DataFrame()
    ok = _timed_together(df).assign(packing=df.packing.astype("string").fillna(""))
    rows = []
    for (_unit, pass_name), group in ok.groupby(["interleave_id", "pass"], sort=False):
        plain = group[group.packing == ""]
        for row in group[group.packing != ""].itertuples():
            same = plain[plain.kernel_requested == row.kernel_requested]
            base = same if len(same) else plain
            unpacked = base.loc[base.time_ms.idxmin()] if len(base) else None
            twin_text = row.packing.replace("packed ", "").replace(" docs", " docs one by one", 1)
            twins = group[(group.packing == twin_text) & (group.kernel_requested == row.kernel_requested)]
            twin = twins.iloc[0] if row.packing.startswith("packed") and len(twins) else None
            times = per_round_times(row.times_ms)
            rows.append({
                "label": row.label, "pass": pass_name, "seq_len": row.seq_len,
                "kernel_requested": row.kernel_requested, "kernel": row.kernel,
                "time_ms": row.time_ms,
                "vs_unpacked": _ratio_cell(None if unpacked is None else
                                           round_ratio(times, per_round_times(unpacked.times_ms))),
                "unpacked_ms": math.nan if unpacked is None else unpacked.time_ms,
                "vs_one_by_one": _ratio_cell(None if twin is None else
                                             round_ratio(times, per_round_times(twin.times_ms))),
                "density": row.density,
            })
    return pd.DataFrame(rows)


def gqa_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Time and memory of each ``kv_heads < heads`` row over its kernel's ``kv_heads == heads`` row of its rounds."""
    rows = []
    ok = _timed_together(df)
    for (_unit, pass_name, _kernel), group in ok.groupby(["interleave_id", "pass", "kernel_requested"],
                                                       sort=False):
        full = group[group.kv_heads == group.heads]
        if full.empty:
            continue
        base = full.iloc[0]
        base_times = per_round_times(base.times_ms)
        for row in group[group.kv_heads < group.heads].itertuples():
            q50, q25, q75, rounds = round_ratio(per_round_times(row.times_ms), base_times)
            rows.append({"label": row.label, "pass": pass_name, "seq_len": row.seq_len,
                         "kernel": row.kernel_requested, "kernel_ran": row.kernel, "heads": row.heads,
                         "kv_heads": row.kv_heads, "time_ratio": q50, "ratio_q25": q25,
                         "ratio_q75": q75, "rounds": rounds,
                         "memory_ratio": _memory_ratio(row.peak_mem_bytes, base.peak_mem_bytes),
                         "kernel_path": row.kernel_path})
    return pd.DataFrame(rows)


def _provenance(df: pd.DataFrame, run_dir: Path) -> list[str]:
    parts = ["## Provenance", ""]
    segments = read_env(run_dir)
    if segments:
        parts.append(f"Run segments (sweep invocations that added rows): {len(segments)}.")
    cols = [c for c in PROVENANCE if c in df.columns]
    groups = df.assign(**{c: df[c].astype("string").fillna("") for c in cols}).groupby(cols)
    table = groups.agg(rows=("case_id", "size"), first=("timestamp", "min"),
                       last=("timestamp", "max")).reset_index()
    if len(table) > 1:
        parts.append("**Rows from more than one environment** (resumed with --allow-mixed):")
    return [*parts, "", markdown_table(table), ""]


def _saved_config(run_dir: Path) -> dict:
    """The resolved config the sweep saved in the run (``sweep.json``; ``{}``: none)."""
    saved = run_dir / "sweep.json"
    return read_json(saved, what="sweep config") if saved.exists() else {}


def retry_noisy_command(run_dir: Path) -> str:
    """The ``--retry-noisy`` command for ``run_dir`` (its preset's name, else ``CONFIG``)."""
    name = _saved_config(run_dir).get("name")
    config = name if name in list_config_presets() else "CONFIG"
    return f"attn-bench sweep {config} --out {run_dir} --retry-noisy"


def _noise_warning(df: pd.DataFrame, run_dir: Path) -> list[str]:
    """The report's first words when rows were flagged noisy, with the command to measure them again."""
    ok = df[df.status == "ok"]
    noisy = int(ok.noisy.sum())
    if not noisy:
        return []
    threshold = ok.noise_threshold.dropna()
    policy = f"{threshold.max():.0%}" if len(threshold) else f"{DEFAULT_THRESHOLD:.0%} (default)"
    return [f"**Noisy: {noisy} of {len(ok)} ok rows were measured under contention** (their "
            f"repeats' spread, IQR over median, or the calibration probe's change during the "
            f"rounds is above the noise threshold {policy}, or the probe took over "
            f"{SLOW_STATE_FACTOR:g}x the run's quiet probe on the same machine and threads: a "
            f"slow state for the whole case; listed under \"Noisy rows\" below). "
            "Fits and crossovers leave them out and say how many (`noisy_dropped` per fit, "
            "`left out: K noisy rows` after a crossover); the time tables and interleaved "
            "ratios still quote them, marked `noisy`. Measure them "
            "again (with the config and options of the sweep that wrote this run):", "",
            "```", retry_noisy_command(run_dir), "```", ""]


def _noisy_section(df: pd.DataFrame) -> list[str]:
    """The rows flagged noisy, with why."""
    noisy = df[(df.status == "ok") & df.noisy]
    if noisy.empty:
        return []
    quiet = quiet_probes(df.itertuples())
    table = noisy[["label", "kernel_requested", "seq_len", "pass", "time_ms", "times_ms", "probe_ms"]].assign(
        why=[row_verdict(row, quiet) or "flagged when measured" for row in noisy.itertuples()])
    return _section("## Noisy rows (left out of fits and crossovers)", table)


def _section(title: str, table: pd.DataFrame) -> list[str]:
    return [title, "", markdown_table(table), ""]


def _pass_sections(df: pd.DataFrame, table: pd.DataFrame, pass_name: str, points: int,
                   ranges: tuple[tuple[int, int], ...]) -> list[str]:
    columns = ["label", "kernel_requested", "kernel", "causal", "time_exponent",
               "memory_exponent", "fit_range", "noisy_dropped", "max_n", "time_ms_at_max_n",
               "peak_fraction_at_max_n", "first_failure", "crossover_vs_full", "mask_emulated"]
    part = table[table["pass"] == pass_name]
    parts = _section(f"## Scaling, pass `{pass_name}` (fit over the {points} largest ok N)", part[columns])
    rows = df[df["pass"] == pass_name]
    for lo, hi in ranges:
        ranged = scaling_table(rows, n_range=(lo, hi))
        ranged = ranged[ranged.fit_points >= 2]
        if len(ranged):
            parts += _section(f"### Exponents over N = {lo}..{hi}, `{pass_name}`",
                              ranged[["label", "kernel_requested", "kernel", "causal", "time_exponent",
                                      "memory_exponent", "fit_range", "fit_points", "noisy_dropped"]])
    ratio_tables = (
        (interleaved_ratios, "Interleaved ratios, `{}`: time over the fastest kernel timed in the same rounds "
                             "(median of per-round ratios [q25, q75])"),
        (flop_rate_ratios, "FLOP rate over full attention's, `{}`: each row's FLOPs per second over full "
                           "attention's timed in the same rounds (median of per-round ratios [q25, q75])"),
        (packing_ratios, "Packing and padding, `{}`: time over the unpacked row and over the same documents "
                         "run one by one, timed in the same rounds (median of per-round ratios [q25, q75]; "
                         "`density`: allowed pairs over N^2)"),
        (gqa_ratios, "Grouped-query ratios, `{}`: time and memory with `kv_heads` key heads over the same "
                     "kernel with as many key heads as query heads, timed in the same rounds (median of "
                     "per-round ratios [q25, q75])"),
    )
    for table_of, title in ratio_tables:
        table = table_of(rows)
        if len(table):
            parts += _section(f"### {title.format(pass_name)}", table.drop(columns="pass"))
    ok = rows[rows.status == "ok"]
    parts += _section(f"### Median time in ms (IQR, repeats), `{pass_name}`", _pivot(rows, _time_cells(ok)))
    parts += _section(f"### Peak tensor memory above inputs (MiB), `{pass_name}`",
                      _pivot(rows, ok.peak_mem_bytes / 2**20))
    if ok.rss_peak_bytes.notna().any():
        parts += _section(f"### Peak resident memory above inputs (MiB, what the OS saw), `{pass_name}`",
                          _pivot(rows, ok.rss_peak_bytes / 2**20))
    setup = ok[ok.setup_mem_bytes.fillna(0) > 0]
    if len(setup):
        cells = setup.apply(lambda r: f"{cell(r.setup_ms)} ms, {cell(r.setup_mem_bytes / 2**20)} MiB", axis=1)
        parts += _section(f"### Cached mask built once per shape (time, memory kept), `{pass_name}`",
                          _pivot(setup, cells))
    compiled = ok[ok.compile_ms.fillna(0) > 0]
    if len(compiled):
        parts += _section(f"### Compile time in s, never inside a timed call (forward; backward), `{pass_name}`",
                          _pivot(compiled, compiled.apply(_compile_cell, axis=1)))
    return parts


def _compile_cell(row: pd.Series) -> str:
    """``forward s`` and, for a grad pass whose backward was measured, ``; backward s``."""
    backward = row.get("compile_bwd_ms")
    text = cell(row.compile_ms / 1e3)
    return text if pd.isna(backward) else f"{text}; {cell(backward / 1e3)}"


def build_report(run_dir: str | Path, points: int = 4,
                 fit_ranges: tuple[tuple[int, int], ...] = ()) -> str:
    """The report of ``run_dir`` (written to ``report.md``), exponents also over the ``fit_ranges`` and the config's."""
    run_dir = Path(run_dir)
    df = load_results(run_dir, rows_required=True)
    counts = df.groupby("status").size().to_dict()
    parts = [f"# Benchmark report: {run_dir.name}", "", *_noise_warning(df, run_dir),
             "Rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             *_provenance(df, run_dir)]
    table = scaling_table(df, points)
    saved = tuple((int(lo), int(hi)) for lo, hi in _saved_config(run_dir).get("fit_ranges", []))
    ranges = tuple(dict.fromkeys((*saved, *fit_ranges)))
    parts += [COLUMN_LEGEND, ""]
    for pass_name in SPEED_PASSES:
        if (table["pass"] == pass_name).any():
            parts += _pass_sections(df, table, pass_name, points, ranges)
    parts += _noisy_section(df)
    problems = df[df.status != "ok"]
    if len(problems):
        slim = problems[["label", "kernel_requested", "seq_len", "pass", "status", "reason"]]
        parts += _section("## Rows that did not run", slim.drop_duplicates())
    text = "\n".join(parts)
    atomic_write_text(run_dir / REPORT_FILE, text + "\n")
    return text
