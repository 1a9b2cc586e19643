"""Scaling fits, crossover, report tables, plots and compare on results with known answers."""

from __future__ import annotations

import pytest

from bench.engine.results import ResultsWriter
from bench.speed.compare import compare_runs, regressions
from bench.speed.plots import plot_run
from bench.speed.report import build_report
from bench.speed.results import load_results
from bench.speed.scaling import scaling_table

LENGTHS = [512, 1024, 2048, 4096, 8192]


def _row(label, variant, n, pass_name, time_ms, mem, status="ok", kernel="sdpa"):
    return {
        "case_id": f"{label}-{n}", "label": label, "variant": variant, "kernel_requested": "auto",
        "kernel": kernel, "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": pass_name,
        "status": status, "reason": "" if status == "ok" else "x", "time_ms": time_ms,
        "peak_mem_bytes": mem, "mask_emulated": False, "device_name": "cpu",
        "timestamp": "2026-01-01T00:00:00",
    }


def write_run(path, slow_factor=1.0):
    """full: time ~ N^2, memory ~ N; window: time ~ N (slower below 2048), memory ~ N;
    reference full: out of memory from 4096."""
    path.mkdir()
    rows = []
    for pass_name in ("fwd", "fwd_bwd"):
        for n in LENGTHS:
            rows.append(_row("full", "full", n, pass_name, 1e-6 * n * n * slow_factor, 100 * n))
            rows.append(_row("window", "sliding_window", n, pass_name, 2e-3 * n, 50 * n))
            causal = _row("causal", "causal", n, pass_name, 0.5e-6 * n * n, 100 * n)
            rows.append({**causal, "causal": True})
            status = "ok" if n < 4096 else ("oom" if n == 4096 else "skipped")
            row = _row("full", "full", n, pass_name, 3e-6 * n * n, 4 * n * n, status, "reference")
            row["kernel_requested"] = "reference"
            rows.append(row)
    ResultsWriter(path).append(rows)
    return path


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "a")


def test_exponents_crossover_and_largest_n(run):
    table = scaling_table(load_results(run)).set_index(["label", "kernel_requested", "pass"])
    full = table.loc[("full", "auto", "fwd")]
    window = table.loc[("window", "auto", "fwd")]
    ref = table.loc[("full", "reference", "fwd")]
    assert full.time_exponent == pytest.approx(2.0) and full.memory_exponent == pytest.approx(1.0)
    assert window.time_exponent == pytest.approx(1.0)
    assert ref.memory_exponent == pytest.approx(2.0)
    # window 2e-3*N < 1e-6*N^2  <=>  N > 2000: faster from 2048 on
    assert window.crossover_vs_full == "2048"
    assert full.crossover_vs_full == "-"
    assert ref.max_n == 2048 and ref.first_failure == "4096 (oom)"
    assert window.max_n == 8192
    # causal attention is itself a baseline, never compared with non-causal full
    assert table.loc[("causal", "auto", "fwd")].crossover_vs_full == "-"


def test_crossover_compares_like_with_like_and_says_below_the_range(tmp_path):
    """A causal window is compared with causal attention, not with (twice as slow)
    non-causal full; a curve faster at every length crosses below the range."""
    path = tmp_path / "c"
    path.mkdir()
    rows = []
    for n in LENGTHS:
        rows.append(_row("full", "full", n, "fwd", 1e-6 * n * n, 100 * n))
        rows.append({**_row("causal", "causal", n, "fwd", 0.5e-6 * n * n, 100 * n), "causal": True})
        # 0.8e-6 N^2 at small N (slower than causal, faster than full), linear at large N
        t = 0.8e-6 * n * n if n <= 1024 else 4e-4 * n
        rows.append({**_row("cwin", "sliding_window", n, "fwd", t, 50 * n), "causal": True})
        rows.append(_row("win", "sliding_window", n, "fwd", 1e-4 * n, 50 * n))
        rows.append(_row("slow", "dilated", n, "fwd", 1e-2 * n * n, 50 * n))
    ResultsWriter(path).append(rows)
    table = scaling_table(load_results(path)).set_index("label")
    # vs causal: 0.8e-6 N^2 > 0.5e-6 N^2 up to 1024; 4e-4 N < 0.5e-6 N^2 from N > 800 -> 2048
    assert table.loc["cwin", "crossover_vs_full"] == "2048"
    assert table.loc["win", "crossover_vs_full"] == "< 512 (below the range)"
    assert table.loc["slow", "crossover_vs_full"] == "none up to 8192"


def test_report_prints_markdown_tables(run):
    text = build_report(run)
    assert "## Scaling, pass `fwd`" in text and "## Scaling, pass `fwd_bwd`" in text
    assert "| window | auto | sdpa | False | 1 | 1 |" in text
    assert "4096 (oom)" in text and (run / "report.md").read_text().strip() == text.strip()


def test_exponents_over_a_chosen_range(tmp_path):
    """A curve linear up to 2048 and quadratic above: the range fit sees only its own part."""
    path = tmp_path / "r"
    path.mkdir()
    rows = [_row("bend", "sliding_window", n, "fwd", 1e-3 * n if n <= 2048 else 1e-3 * n * n / 2048,
                 10 * n) for n in LENGTHS]
    ResultsWriter(path).append(rows)
    df = load_results(path)
    low = scaling_table(df, n_range=(512, 2048)).iloc[0]
    high = scaling_table(df, n_range=(2048, 8192)).iloc[0]
    assert low.time_exponent == pytest.approx(1.0) and low.fit_points == 3
    assert low.fit_range == "512-2048"
    assert high.time_exponent == pytest.approx(2.0) and high.memory_exponent == pytest.approx(1.0)
    text = build_report(path, fit_ranges=((512, 2048),))
    assert "### Exponents over N = 512..2048, `fwd`" in text
    assert "| bend | auto | sdpa | False | 1 | 1 | 512-2048 | 3 |" in text
    # the range written in the sweep config (saved as sweep.json) is reported too
    (path / "sweep.json").write_text('{"name": "r", "fit_ranges": [[2048, 8192]]}')
    assert "| bend | auto | sdpa | False | 2 | 1 | 2048-8192 | 3 |" in build_report(path)


def test_plots_are_written(run):
    paths = plot_run(run)
    assert {p.name for p in paths} == {"scaling.png", "scaling.svg"}
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_compare_flags_regressions(tmp_path):
    base, slower = write_run(tmp_path / "a"), write_run(tmp_path / "b", slow_factor=1.3)
    table = compare_runs(base, slower)
    full = table[(table.label == "full") & (table.kernel_requested == "auto")]
    assert full.change_pct.round(6).eq(30.0).all()
    assert (table[table.kernel_requested == "reference"].change_pct.abs() < 1e-9).all()
    assert len(regressions(table, 25)) == len(full) and len(regressions(table, 35)) == 0
