"""Scaling fits, crossover, report tables, plots and compare on results with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
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


# A crossover needs evidence: two lengths on each side whose repeats' spreads do not overlap full
# attention's, else "not determined" and why; the plot's title names slope guides only when drawn.
def _spread_row(label: str, variant: str, n: int, times: list[float]) -> dict:
    median = sorted(times)[len(times) // 2]
    return {
        "case_id": f"{label}-{n}", "label": label, "variant": variant, "kernel_requested": "auto",
        "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": "fwd", "status": "ok",
        "reason": "", "time_ms": median, "times_ms": json.dumps(times), "repeats": len(times),
        "peak_mem_bytes": 100 * n, "mask_emulated": False, "noisy": False,
        "device_name": "cpu", "timestamp": "2026-01-01T00:00:00",
    }


def _run(path: Path, curves: dict[int, tuple[list[float], list[float]]]) -> Path:
    """A run of full attention and a window curve: per length, (full's repeats, window's)."""
    path.mkdir()
    rows = []
    for n, (full, window) in curves.items():
        rows += [_spread_row("full", "full", n, full), _spread_row("window", "sliding_window", n, window)]
    ResultsWriter(path).append(rows)
    return path


def _crossover(path: Path) -> str:
    table = scaling_table(load_results(path)).set_index("label")
    return table.loc["window", "crossover_vs_full"]


def test_one_length_with_overlapping_spreads_is_not_determined(tmp_path: Path) -> None:
    """The issue's plug-in sweep: 7.55 against 7.75 ms at one length, spreads overlapping."""
    run = _run(tmp_path / "one", {1024: ([7.6, 7.75, 7.9], [7.4, 7.55, 7.8])})
    said = "not determined: one common length (N=1024); needs two lengths on each side"
    assert _crossover(run) == said
    assert said in build_report(run)


def test_two_clear_lengths_on_each_side_determine_it(tmp_path: Path) -> None:
    run = _run(tmp_path / "clear", {
        512: ([1.0, 1.0, 1.1], [2.0, 2.1, 2.2]), 1024: ([4.0, 4.1, 4.2], [5.0, 5.1, 5.2]),
        2048: ([16.0, 16.5, 17.0], [10.0, 10.2, 10.4]), 4096: ([64, 65, 66], [20, 20.5, 21])})
    assert _crossover(run) == "2048"


def test_overlapping_spreads_at_the_switch_are_not_determined(tmp_path: Path) -> None:
    """The medians cross at 2048 (9.9 < 10.0) but the repeats overlap there."""
    run = _run(tmp_path / "overlap", {
        512: ([1.0, 1.0, 1.1], [2.0, 2.1, 2.2]), 1024: ([4.0, 4.1, 4.2], [5.0, 5.1, 5.2]),
        2048: ([9.0, 10.0, 11.0], [9.5, 9.9, 10.5]), 4096: ([64, 65, 66], [20, 20.5, 21]),
        8192: ([256, 260, 264], [40, 41, 42])})
    assert _crossover(run) == ("not determined: faster from N=4096 on; below it spreads "
                               "overlap at N=2048")


def test_faster_at_the_largest_length_only_is_not_determined(tmp_path: Path) -> None:
    run = _run(tmp_path / "last", {
        512: ([1.0, 1.0, 1.1], [2.0, 2.1, 2.2]), 1024: ([4.0, 4.1, 4.2], [5.0, 5.1, 5.2]),
        2048: ([16.0, 16.5, 17.0], [10.0, 10.2, 10.4])})
    assert _crossover(run) == ("not determined: faster only at the largest length N=2048; "
                               "needs two lengths on each side")


def test_one_slower_length_below_is_not_enough(tmp_path: Path) -> None:
    run = _run(tmp_path / "below", {
        512: ([1.0, 1.0, 1.1], [2.0, 2.1, 2.2]), 1024: ([16.0, 16.5, 17.0], [10.0, 10.2, 10.4]),
        2048: ([64, 65, 66], [20, 20.5, 21])})
    assert _crossover(run) == ("not determined: faster from N=1024 on; below it slower only "
                               "at N=512; needs two lengths on each side")


def test_below_and_beyond_the_range_need_two_clear_lengths(tmp_path: Path) -> None:
    faster = _run(tmp_path / "faster", {512: ([4.0, 4.1, 4.2], [1.0, 1.0, 1.1]),
                                        1024: ([16.0, 16.5, 17.0], [2.0, 2.1, 2.2])})
    assert _crossover(faster) == "< 512 (below the range)"
    slower = _run(tmp_path / "slower", {512: ([1.0, 1.0, 1.1], [4.0, 4.1, 4.2]),
                                        1024: ([2.0, 2.1, 2.2], [16.0, 16.5, 17.0])})
    assert _crossover(slower) == "none up to 1024"
    tied = _run(tmp_path / "tied", {512: ([1.0, 1.0, 1.1], [4.0, 4.1, 4.2]),
                                    1024: ([2.0, 2.5, 3.0], [2.2, 2.4, 2.6])})
    assert _crossover(tied) == "not determined: spreads overlap at N=1024"


@pytest.mark.parametrize(("lengths", "promised"), [((1024,), False), ((512, 1024), True)])
def test_the_plot_title_names_slope_guides_only_when_drawn(tmp_path: Path, monkeypatch,
                                                           lengths, promised) -> None:
    titles: list[str] = []
    original = matplotlib.figure.Figure.suptitle

    def record(self, text, *args, **kwargs):
        titles.append(text)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", record)
    run = _run(tmp_path / "plot", {n: ([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]) for n in lengths})
    plot_run(run)
    title, = titles
    assert ("slope 1" in title) is promised and ("slope 2" in title) is promised


# A fit never spans a kernel switch: `auto` runs SDPA at short N and blocked above; each kernel that
# ran is fitted on its own and the plot's legend names the kernel of each segment.
SHORT, LONG = [128, 256, 512], [1024, 2048, 4096, 8192]


def _segment_row(n: int, time_ms: float, kernel: str) -> dict:
    return {
        "case_id": f"w-{n}", "label": "window", "variant": "sliding_window",
        "kernel_requested": "auto", "kernel": kernel, "params": "{}", "seq_len": n, "batch": 1,
        "heads": 8, "head_dim": 64, "dtype": "float32", "device": "cpu", "causal": False,
        "pass": "fwd", "status": "ok", "reason": "", "time_ms": time_ms,
        "times_ms": json.dumps([time_ms] * 3), "noisy": False, "peak_mem_bytes": 10 * n * n
        if kernel == "sdpa" else 1000 * n, "mask_emulated": kernel == "sdpa",
        "device_name": "cpu", "timestamp": "2026-01-01T00:00:00",
    }


@pytest.fixture
def auto_run(tmp_path: Path) -> Path:
    """auto's rows: SDPA with a mask (time and memory ~ N^2) below 768, blocked (~ N) above,
    the recorded ``kernel`` saying which ran."""
    path = tmp_path / "auto"
    path.mkdir()
    rows = [_segment_row(n, 1e-5 * n * n, "sdpa") for n in SHORT]
    rows += [_segment_row(n, 1e-2 * n, "blocked") for n in LONG]
    ResultsWriter(path).append(rows)
    return path


def test_each_kernel_that_ran_is_fitted_apart(auto_run: Path) -> None:
    table = scaling_table(load_results(auto_run)).set_index("kernel")
    assert sorted(table.index) == ["blocked", "sdpa"]
    sdpa, blocked = table.loc["sdpa"], table.loc["blocked"]
    assert sdpa.time_exponent == pytest.approx(2.0) and sdpa.memory_exponent == pytest.approx(2.0)
    assert sdpa.fit_range == "128-512" and sdpa.max_n == 512 and bool(sdpa.mask_emulated)
    assert blocked.time_exponent == pytest.approx(1.0)
    assert blocked.memory_exponent == pytest.approx(1.0)
    assert blocked.fit_range == "1024-8192" and not blocked.mask_emulated
    # over a range across the switch each kernel still keeps to its own rows
    ranged = scaling_table(load_results(auto_run), n_range=(256, 2048)).set_index("kernel")
    assert ranged.loc["sdpa", "fit_range"] == "256-512"
    assert ranged.loc["blocked", "fit_range"] == "1024-2048"
    assert ranged.loc["blocked", "time_exponent"] == pytest.approx(1.0)
    text = build_report(auto_run)
    assert "| window | auto | sdpa | False | 2 | 2 | 128-512 |" in text
    assert "| window | auto | blocked | False | 1 | 1 | 1024-8192 |" in text


def test_the_plot_legend_names_the_kernel_of_each_segment(auto_run: Path, monkeypatch) -> None:
    legends: list[list[str]] = []
    original = matplotlib.figure.Figure.legend

    def record(self, handles, labels, *args, **kwargs):
        legends.append(list(labels))
        return original(self, handles, labels, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "legend", record)
    plot_run(auto_run)
    names, = legends
    assert names[:2] == ["window [auto: sdpa]", "window [auto: blocked]"]
    assert "window [auto]" not in names and "auto" not in names
