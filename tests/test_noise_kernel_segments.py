"""A fit never spans a kernel switch: ``auto`` runs SDPA at short N and blocked above, and
the report fits each kernel that ran on its own, the plot's legend names the kernel of each
segment, and ``attn-bench list`` says what ``auto`` picks as a function of N."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import pytest
import torch
from typer.testing import CliRunner

from attn import create_attention
from bench.cli import app
from bench.cli.variants import auto_by_length
from bench.engine.results import ResultsWriter
from bench.speed.plots import plot_run
from bench.speed.report import build_report
from bench.speed.results import load_results
from bench.speed.scaling import scaling_table

SHORT, LONG = [128, 256, 512], [1024, 2048, 4096, 8192]


def _row(n: int, time_ms: float, kernel: str) -> dict:
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
def run(tmp_path: Path) -> Path:
    """auto's rows: SDPA with a mask (time and memory ~ N^2) below 768, blocked (~ N) above,
    the recorded ``kernel`` saying which ran."""
    path = tmp_path / "auto"
    path.mkdir()
    rows = [_row(n, 1e-5 * n * n, "sdpa") for n in SHORT]
    rows += [_row(n, 1e-2 * n, "blocked") for n in LONG]
    ResultsWriter(path).append(rows)
    return path


def test_each_kernel_that_ran_is_fitted_apart(run: Path) -> None:
    table = scaling_table(load_results(run)).set_index("kernel")
    assert sorted(table.index) == ["blocked", "sdpa"]
    sdpa, blocked = table.loc["sdpa"], table.loc["blocked"]
    assert sdpa.time_exponent == pytest.approx(2.0) and sdpa.memory_exponent == pytest.approx(2.0)
    assert sdpa.fit_range == "128-512" and sdpa.max_n == 512 and bool(sdpa.mask_emulated)
    assert blocked.time_exponent == pytest.approx(1.0)
    assert blocked.memory_exponent == pytest.approx(1.0)
    assert blocked.fit_range == "1024-8192" and not blocked.mask_emulated
    # over a range across the switch each kernel still keeps to its own rows
    ranged = scaling_table(load_results(run), n_range=(256, 2048)).set_index("kernel")
    assert ranged.loc["sdpa", "fit_range"] == "256-512"
    assert ranged.loc["blocked", "fit_range"] == "1024-2048"
    assert ranged.loc["blocked", "time_exponent"] == pytest.approx(1.0)
    text = build_report(run)
    assert "| window | auto | sdpa | False | 2 | 2 | 128-512 |" in text
    assert "| window | auto | blocked | False | 1 | 1 | 1024-8192 |" in text


def test_the_plot_legend_names_the_kernel_of_each_segment(run: Path, monkeypatch) -> None:
    legends: list[list[str]] = []
    original = matplotlib.figure.Figure.legend

    def record(self, handles, labels, *args, **kwargs):
        legends.append(list(labels))
        return original(self, handles, labels, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "legend", record)
    plot_run(run)
    names, = legends
    assert names[:2] == ["window [auto: sdpa]", "window [auto: blocked]"]
    assert "window [auto]" not in names and "auto" not in names


def test_list_says_what_auto_picks_as_a_function_of_n() -> None:
    cpu = torch.float32
    window = create_attention("sliding_window", num_heads=8, head_dim=64)
    assert auto_by_length(window, "cpu", cpu) == "auto -> sdpa for N < 768, blocked from N = 768"
    relative = create_attention("relative", num_heads=8, head_dim=64)
    assert auto_by_length(relative, "cpu", cpu) == "auto -> sdpa for N < 1024, relative from N = 1024"
    full = create_attention("full", num_heads=8, head_dim=64)
    assert auto_by_length(full, "cpu", cpu) == "auto -> sdpa"
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "  auto:    sdpa for N < 768, blocked from N = 768\n" in result.output
    assert "  auto:    blocked\n" not in result.output  # untrue at short N
