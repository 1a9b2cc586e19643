"""A crossover needs evidence: two lengths on each side whose repeats' spreads do not overlap
full attention's, else the report says "not determined" and why; and the scaling plot's
title names slope guides only when it draws them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import pytest

from bench.engine.results import ResultsWriter
from bench.speed.plots import plot_run
from bench.speed.report import build_report
from bench.speed.results import load_results
from bench.speed.scaling import scaling_table


def _row(label: str, variant: str, n: int, times: list[float]) -> dict:
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
        rows += [_row("full", "full", n, full), _row("window", "sliding_window", n, window)]
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
