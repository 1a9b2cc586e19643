"""Noise is detected and said: every ok row carries its repeats' relative spread, a
calibration probe timed before and after its rounds and a ``noisy`` flag; fits and
crossovers leave flagged rows out and count them; the report says so at its top with the
command that measures them again (``--retry-noisy``); the noise threshold is a setting a
resume compares."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.config import ConfigError
from bench.engine.results import RESULTS_FILE, ResultsWriter, read_table
from bench.runner import load_run
from bench.speed.noise import (
    noise_columns,
    probe_change,
    quiet_probes,
    relative_spread,
    slow_verdict,
    why_noisy,
)
from bench.speed.report import build_report
from bench.speed.results import load_results
from bench.speed.scaling import scaling_table
from bench.speed.sweep import MixedEnvironmentError, run_sweep

LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]


@pytest.fixture(autouse=True)
def _unregister():
    from bench.engine.testing import unregister_test_variants

    yield
    unregister_test_variants()


def _row(label: str, variant: str, n: int, time_ms: float, **extra) -> dict:
    return {
        "case_id": f"{label}-{n}", "label": label, "variant": variant, "kernel_requested": "auto",
        "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": "fwd", "status": "ok",
        "reason": "", "time_ms": time_ms, "peak_mem_bytes": 100 * n, "mask_emulated": False,
        "device_name": "cpu", "timestamp": "2026-01-01T00:00:00", **extra,
    }


def _quiet(t: float) -> dict:
    return {"times_ms": json.dumps([t, t, t]), "time_spread": 0.0, "noisy": False,
            "probe_ms": "[0.4, 0.41]", "noise_threshold": 0.25}


def _noisy_run(path: Path) -> Path:
    """full ~ N^2 and window ~ N, each with one row measured under contention: window at
    4096 (a busy machine made it 20x slower: [687, 93, 166]-like repeats) and full at 16384."""
    path.mkdir()
    rows = []
    for n in LENGTHS:
        full, window = 1e-6 * n * n, 2e-3 * n
        rows.append(_row("full", "full", n, full, **_quiet(full)))
        rows.append(_row("window", "sliding_window", n, window, **_quiet(window)))
    rows[9] = _row("window", "sliding_window", 4096, 20 * 2e-3 * 4096,
                   times_ms="[687, 163.84, 93]", time_spread=1.8, noisy=True,
                   probe_ms="[0.4, 0.9]", noise_threshold=0.25)
    rows[12] = _row("full", "full", 16384, 0.01, times_ms="[0.01, 0.3, 0.009]", time_spread=1.5,
                   noisy=True, probe_ms="[0.4, 0.4]", noise_threshold=0.25)
    ResultsWriter(path).append(rows)
    return path


def test_spread_probe_and_verdict_have_known_values() -> None:
    assert relative_spread([687, 93, 166]) == pytest.approx((426.5 - 129.5) / 166)
    assert relative_spread([2.0, 2.0, 2.0]) == 0.0
    assert probe_change([0.4, 0.9]) == pytest.approx(1.25)
    assert why_noisy(0.05, 0.02, 0.25) == ""
    assert why_noisy(1.79, 0.02, 0.25) == "spread 179% > 25%"
    assert why_noisy(0.05, 1.25, 0.25) == "probe changed 125% > 25%"
    steady = noise_columns([10.0, 10.2, 9.9, 10.1, 10.0], [0.40, 0.42], 0.25)
    assert steady["noisy"] is False and steady["time_spread"] == pytest.approx(0.01)
    assert json.loads(steady["probe_ms"]) == [0.4, 0.42]
    assert noise_columns([10.0, 10.2, 9.9, 10.1, 10.0], [0.40, 0.80], 0.25)["noisy"] is True


def test_fits_and_crossovers_leave_noisy_rows_out_and_count_them(tmp_path: Path) -> None:
    table = scaling_table(load_results(_noisy_run(tmp_path / "run"))).set_index("label")
    window, full = table.loc["window"], table.loc["full"]
    # without the noisy rows: window ~ N, full ~ N^2 over the four largest quiet lengths
    assert window.time_exponent == pytest.approx(1.0) and window.noisy_dropped == 1
    assert full.time_exponent == pytest.approx(2.0) and full.noisy_dropped == 1
    assert window.fit_range == "1024-16384" and full.fit_range == "1024-8192"
    # full's noisy 0.01 ms at 16384 would make window "none up to 16384"; both left out
    assert window.crossover_vs_full == "2048 (left out: 2 noisy rows)"


def test_rows_written_before_the_flag_are_judged_by_their_spread(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.mkdir()
    header = ["case_id", "label", "variant", "kernel_requested", "kernel", "seq_len", "pass",
              "status", "time_ms", "times_ms", "timestamp"]
    rows = [["a", "w", "sliding_window", "auto", "sdpa", "512", "fwd", "ok", "166",
             '"[687, 93, 166]"', "t"],
            ["b", "w", "sliding_window", "auto", "sdpa", "1024", "fwd", "ok", "7",
             '"[7.0, 7.1, 6.9]"', "t"]]
    (path / RESULTS_FILE).write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    df = load_results(path).set_index("case_id")
    assert bool(df.loc["a", "noisy"]) is True and bool(df.loc["b", "noisy"]) is False


def test_the_report_says_so_at_the_top_with_the_command(tmp_path: Path) -> None:
    run = _noisy_run(tmp_path / "run")
    (run / "sweep.json").write_text(json.dumps({"name": "quick"}))
    text = build_report(run)
    top = text.split("## ")[0]
    assert "**Noisy: 2 of 14 ok rows were measured under contention**" in top
    assert f"attn-bench sweep quick --out {run} --retry-noisy" in top
    assert "## Noisy rows (left out of fits and crossovers)" in text
    assert "spread 180% > 25%; probe changed 125% > 25%" in text
    assert "164 (iqr" in text and ", noisy)" in text  # the time table marks the noisy cell
    clean = tmp_path / "clean"
    clean.mkdir()
    ResultsWriter(clean).append([_row("full", "full", n, 1e-6 * n * n, **_quiet(1e-6 * n * n))
                                 for n in LENGTHS])
    assert "Noisy" not in build_report(clean) and "noisy)" not in build_report(clean)


def _config(**extra) -> dict:
    return {"name": "noise", "passes": ["fwd"], "seq_len": [16], "heads": 1, "head_dim": 8,
            "repeats": 5, "min_repeats": 5, "timeout_s": 60, "threads": 1,
            "plugins": ["bench.engine.testing"], "peak_matmul_size": 128,
            "variants": [{"name": "bench_sleep", "seconds": 0.01},
                         {"name": "bench_jitter", "seconds": 0.01, "slow": 20}], **extra}


def test_rows_carry_their_noise_and_retry_noisy_measures_only_those(tmp_path: Path) -> None:
    config = tmp_path / "noise.yaml"
    config.write_text(yaml.safe_dump(_config()))
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert first.exit_code == 0, first.output
    rows = pd.read_csv(out / RESULTS_FILE).set_index("variant")
    steady, jitter = rows.loc["bench_sleep"], rows.loc["bench_jitter"]
    assert jitter.time_spread > 0.9  # 20x slower on every 2nd call: median 1x or 20x
    assert jitter.noisy and jitter.noise_threshold == 0.25
    quiet = quiet_probes(read_table(out).rows)
    for row in (steady, jitter):
        before, after = json.loads(row.probe_ms)
        assert before > 0 and after > 0
        verdict = why_noisy(row.time_spread, probe_change([before, after]), 0.25)
        # the flag is what its readings say (and a slow state against the run's quiet probe)
        assert bool(row.noisy) is bool(verdict or slow_verdict(row, quiet))
    noisy = set(rows[rows.noisy].case_id)
    assert f"{len(noisy)} of them noisy" in first.output and "--retry-noisy" in first.output
    again = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots",
                                     "--retry-noisy"])
    assert again.exit_code == 0, again.output
    after = pd.read_csv(out / RESULTS_FILE).set_index("case_id")
    for case_id, old in rows.set_index("case_id").iterrows():
        remeasured = after.loc[case_id, "times_ms"] != old.times_ms
        assert remeasured is (case_id in noisy), case_id
    assert len(after) == 2


def test_the_noise_threshold_is_a_setting_a_resume_compares(tmp_path: Path) -> None:
    out = tmp_path / "out"
    quiet = {"variants": [{"name": "bench_sleep", "seconds": 0.01}], "repeats": 2,
             "min_repeats": 2}
    run_sweep(load_run(_config(**quiet)), out)
    before = (out / RESULTS_FILE).read_text()
    assert run_sweep(load_run(_config(**quiet)), out) == []
    with pytest.raises(MixedEnvironmentError, match=r"noise_threshold 0.25 -> 0.5"):
        run_sweep(load_run(_config(noise_threshold=0.5, **quiet)), out)
    assert (out / RESULTS_FILE).read_text() == before
    with pytest.raises(ConfigError, match="noise_threshold"):
        load_run(_config(noise_threshold=0))


def test_the_probe_is_long_enough_for_the_host_clock_on_each_device(monkeypatch):
    """The probe's matmul is sized per device: on CUDA at least 1 ms even at 100 TFLOP/s (a 256
    matmul took 25-40 us on an H200, and the host clock's jitter alone flagged quiet rows); on
    the CPU at least 1 ms at 100 GFLOP/s (a 256 matmul's 0.3-0.6 ms moved 25% by itself) and
    small enough not to slow a sweep. A CUDA probe synchronises around each call."""
    import torch

    from bench.engine import measure

    assert 2 * measure.probe_size(torch.device("cuda")) ** 3 / 100e12 >= 1e-3
    assert 1e-3 <= 2 * measure.probe_size(torch.device("cpu")) ** 3 / 100e9 <= 1e-2
    sizes, syncs = [], []
    real_randn = torch.randn

    def recording_randn(*shape, **kwargs):
        sizes.append(shape)
        return real_randn(*shape, **kwargs)

    monkeypatch.setattr(measure.torch, "randn", recording_randn)
    monkeypatch.setattr(measure.torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    seconds = measure.calibration_probe(torch.device("cpu"), calls=3)
    assert sizes == [(512, 512)] and not syncs and 0 < seconds < 1
    # a CUDA probe, its tensor kept on the CPU (torch.Tensor.to is told "cuda" and answers with itself)
    monkeypatch.setattr(measure.torch.Tensor, "to", lambda self, device: self)
    monkeypatch.setattr(measure.torch, "matmul", lambda a, b: None)  # not 4096^3 on this CPU
    sizes.clear()
    measure.calibration_probe(torch.device("cuda"), calls=3)
    assert sizes == [(4096, 4096)] and len(syncs) == 2 * 4  # before and after each of 1 + 3 calls


def test_a_probe_reading_is_its_fastest_call(monkeypatch):
    """One call caught by a timer tick or a thread's wake-up does not move the reading; a load
    that slows every call does."""
    import torch

    from bench.engine import measure

    ticks = iter([0.0, 9.0,  # the warm-up: not counted
                  10.0, 10.004, 11.0, 11.002, 12.0, 12.050])  # calls of 4, 2 and 50 ms
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(measure.torch, "matmul", lambda a, b: None)
    assert measure.calibration_probe(torch.device("cpu"), calls=3) == pytest.approx(0.002)
