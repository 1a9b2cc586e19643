"""The speed report (bench/speed/report.py): its FLOP-rate table, each row's FLOPs per second over full
attention's, round by round; its column legend."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.speed.report import flop_rate_ratios


def _row(variant: str, kernel: str, flops: float, times: list[float], unit: str = "u", **extra) -> dict:
    return {"status": "ok", "interleaved": 3, "interleave_id": unit, "pass": "fwd", "label": variant,
            "variant": variant, "seq_len": 4096, "kernel_requested": kernel, "kernel": kernel,
            "flops": flops, "flops_kind": "useful", "times_ms": json.dumps(times),
            "time_ms": sorted(times)[len(times) // 2], **extra}


def test_rates_are_divided_round_by_round_against_the_fastest_full_attention_row():
    df = pd.DataFrame([
        _row("full", "sdpa", 100.0, [10, 20, 10]),
        _row("full", "chunked", 100.0, [40, 40, 40]),  # slower full attention: not the reference
        _row("sliding_window", "blocked", 25.0, [5, 5, 10]),  # rounds: 0.5, 1.0, 0.25 of full's rate
    ])
    [row] = flop_rate_ratios(df).to_dict("records")
    assert row["label"] == "sliding_window" and row["vs"] == "full sdpa" and row["rounds"] == 3
    assert row["rate_ratio"] == pytest.approx(0.5)  # (25 / 5) / (100 / 10), the median round
    assert row["ratio_q25"] == pytest.approx(0.375) and row["ratio_q75"] == pytest.approx(0.75)


def test_units_without_full_attention_or_flops_give_no_rows():
    df = pd.DataFrame([
        _row("sliding_window", "blocked", 25.0, [5, 5, 5], unit="a"),
        _row("dilated", "blocked", 25.0, [5, 5, 5], unit="a"),
        _row("full", "sdpa", 100.0, [10, 10, 10], unit="b"),
        _row("nystrom", "native", float("nan"), [5, 5, 5], unit="b"),
    ])
    assert flop_rate_ratios(df).empty


# The report explains its columns (peak_fraction_at_max_n, mask_emulated) before its tables.
def test_the_report_explains_peak_fraction_and_mask_emulated(sweep_out) -> None:
    from bench.speed.report import build_report

    out, _ = sweep_out
    text = build_report(out)
    assert "peak_fraction_at_max_n" in text and "mask_emulated" in text  # the columns explained
    legend = next(line for line in text.splitlines() if line.startswith("Columns: "))
    assert "`peak_fraction_at_max_n` is" in legend and "matmul" in legend
    assert "`mask_emulated` is True when" in legend and "N x N" in legend
    assert text.index(legend) < text.index("## Scaling")
