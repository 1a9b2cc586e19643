"""Noise is detected and said: every ok row carries its repeats' relative spread, a
calibration probe timed before and after its rounds and a ``noisy`` flag; fits and
crossovers leave flagged rows out and count them; the report says so at its top with the
command that measures them again (``--retry-noisy``); the noise threshold is a setting a
resume compares."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
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
    SLOW_STATE_FACTOR,
    is_noisy,
    noise_columns,
    noisy_in,
    probe_change,
    probe_level,
    probe_scope,
    quiet_probes,
    relative_spread,
    row_verdict,
    slow_state_marker,
    slow_verdict,
    why_noisy,
    why_slow,
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


# A row measured while the machine sat in a slow state for the whole case is flagged: its probe over
# SLOW_STATE_FACTOR times the run's quiet probe (same machine, device, threads and torch) is `noisy`;
# the last test makes a worker really slow (a real-time CPU hog sharing its core).
ROOT = Path(__file__).resolve().parents[1]


HOST = {"hostname": "node-a", "device_name": "Some CPU", "threads": 2, "torch_version": "2.5.1"}


def _probe_row(label: str, variant: str, n: int, time_ms: float, probe: list[float], **extra) -> dict:
    """An ok row as the sweep writes it: spread 1%, its probe's change under 25%, so not
    flagged when measured (``noisy`` False), whatever its probe's level."""
    times = [time_ms * 0.99, time_ms, time_ms * 1.01]
    return {
        "case_id": f"{label}-{n}", "label": label, "variant": variant, "kernel_requested": "auto",
        "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": "fwd", "status": "ok",
        "reason": "", "time_ms": time_ms, "times_ms": json.dumps(times), "time_spread": 0.01,
        "probe_ms": json.dumps(probe), "noisy": False, "noise_threshold": 0.25,
        "peak_mem_bytes": 100 * n, "mask_emulated": False, "timestamp": "2026-01-01T00:00:00",
        **HOST, **extra,
    }


def _slow_nystrom_run(path: Path) -> Path:
    """The user's run: README's first command while another job ran. Nystrom took 365 ms at
    every N (8 ms in a plain process) with spreads of 1% and a probe of 8.0 ms before and
    after its rounds, where the run's other rows read 0.12-0.2 ms; a second machine's rows
    (its own quiet probe, 8x slower hardware) are in the same directory."""
    path.mkdir()
    rows = []
    for i, n in enumerate((256, 512, 1024, 2048)):
        quiet = [0.12 + 0.02 * i, 0.13 + 0.02 * i]
        rows.append(_probe_row("full", "full", n, 1e-5 * n * n, quiet))
        rows.append(_probe_row("window", "sliding_window", n, 2e-3 * n, quiet))
        rows.append(_probe_row("nystrom", "nystrom", n, 365.0, [8.0, 8.02]))
        rows.append(_probe_row("full-b", "full", n, 8e-5 * n * n, [0.9 + 0.1 * i, 1.0 + 0.1 * i],
                         hostname="node-b"))
    ResultsWriter(path).append(rows)
    return path


def test_the_rule_has_known_values() -> None:
    assert probe_level([8.0, 8.02]) == 8.0 and probe_level([0.2, 6.0]) == 0.2  # both ends slow
    assert why_slow(8.0, 0.12) == "slow state: probe 8 ms against the run's quiet 0.12 ms (67x > 3x)"
    assert why_slow(2.9 * 0.2, 0.2) == "" and why_slow(3.1 * 0.2, 0.2).startswith("slow state")
    assert why_slow(8.0, float("nan")) == "" and why_slow(float("nan"), 0.12) == ""
    assert SLOW_STATE_FACTOR == 3.0
    rows = [_probe_row("a", "full", 16, 1.0, [0.12, 0.13]), _probe_row("b", "full", 16, 1.0, [8.0, 8.0]),
            _probe_row("c", "full", 16, 1.0, [8.0, 8.0], threads=1),
            _probe_row("d", "full", 16, 1.0, [8.0, 8.0], hostname="node-b"),
            _probe_row("e", "full", 16, 1.0, [8.0, 8.0], torch_version="2.6.0")]
    quiet = quiet_probes(rows)
    # each machine, thread count and torch is compared with itself only
    assert quiet == {probe_scope(rows[0]): 0.12, probe_scope(rows[2]): 8.0,
                     probe_scope(rows[3]): 8.0, probe_scope(rows[4]): 8.0}
    assert [is_noisy(row, quiet) for row in rows] == [False, True, False, False, False]
    assert row_verdict(rows[1], quiet) == "slow state: probe 8 ms against the run's quiet 0.12 ms (67x > 3x)"
    assert not is_noisy(rows[1])  # without the run: the row's own readings say nothing
    # a row slow at one end only is a change, not a slow state
    changed = _probe_row("f", "full", 16, 1.0, [0.12, 8.0])
    assert row_verdict(changed, quiet) == "probe changed 6567% > 25%"
    # failure rows, and rows written before the probe, are never slow
    assert not is_noisy({**rows[1], "status": "timeout"}, quiet)
    assert not is_noisy({**rows[1], "probe_ms": "", "noisy": ""}, quiet)


def test_a_run_in_a_slow_state_is_flagged_reported_and_left_out_of_fits(tmp_path: Path) -> None:
    run = _slow_nystrom_run(tmp_path / "run")
    (run / "sweep.json").write_text(json.dumps({"name": "quick"}))
    df = load_results(run)
    flagged = df[df.noisy]
    assert set(flagged.variant) == {"nystrom"} and len(flagged) == 4  # node-b's rows: its own quiet
    assert not pd.read_csv(run / RESULTS_FILE).noisy.any()  # as written: no flag
    dropped = scaling_table(df).set_index("label").noisy_dropped
    assert dropped[flagged.label.iloc[0]] == 4 and dropped["full-b"] == 0 and dropped.sum() == 4
    text = build_report(run)
    top = text.split("## ")[0]
    assert "**Noisy: 4 of 16 ok rows were measured under contention**" in top
    assert "over 3x the run's quiet probe" in top and "--retry-noisy" in top
    section = text.split("## Noisy rows (left out of fits and crossovers)")[1]
    assert section.count("slow state: probe 8 ms against the run's quiet 0.12 ms (67x > 3x)") == 4


def test_the_driver_flags_a_new_row_against_the_rows_before_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    ResultsWriter(run).append([_probe_row("full", "full", 256, 1.0, [0.12, 0.13])])
    mark = slow_state_marker(run)
    slow, elsewhere = _probe_row("nystrom", "nystrom", 256, 365.0, [8.0, 8.0]), _probe_row(
        "nystrom", "nystrom", 512, 365.0, [8.0, 8.0], threads=1)
    failed = {**_probe_row("x", "full", 16, 1.0, [8.0, 8.0]), "status": "oom", "probe_ms": ""}
    for row in (slow, elsewhere, failed):
        mark(row)
    assert slow["noisy"] is True and elsewhere["noisy"] is False and failed["noisy"] is False
    quiet_later = _probe_row("window", "sliding_window", 256, 0.5, [0.1, 0.1], threads=1)
    mark(quiet_later)  # it becomes the quiet probe of threads=1 for the rows after it
    later = _probe_row("nystrom", "nystrom", 1024, 365.0, [8.0, 8.0], threads=1)
    mark(later)
    assert quiet_later["noisy"] is False and later["noisy"] is True


def _slow_config(**extra) -> dict:
    return {"name": "slow-state", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1,
            "head_dim": 8, "repeats": 3, "min_repeats": 3, "timeout_s": 60, "threads": 1,
            "plugins": ["bench.engine.testing"], "peak_matmul_size": 128,
            "variants": [{"name": "bench_sleep", "seconds": 0.005}], **extra}


def test_retry_noisy_measures_rows_of_a_slow_state_again(tmp_path: Path) -> None:
    """A measured run whose rows are then given probes as a run written before the slow-state
    check would hold them (recorded ``noisy`` False): N=16 read 0.5 ms throughout, N=32 5 ms.
    ``--retry-noisy`` measures N=32 again, and only it."""
    config = tmp_path / "slow.yaml"
    config.write_text(yaml.safe_dump(_slow_config()))
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert first.exit_code == 0, first.output
    with (out / RESULTS_FILE).open(newline="") as file:  # those cells changed, the rest as measured
        reader = csv.DictReader(file)
        fields, records = reader.fieldnames, list(reader)
    slow_case = next(r["case_id"] for r in records if r["seq_len"] == "32")
    for record in records:
        slow = record["case_id"] == slow_case
        record.update(probe_ms="[5.0, 5.1]" if slow else "[0.5, 0.51]", noisy="False")
    with (out / RESULTS_FILE).open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    before = pd.read_csv(out / RESULTS_FILE).set_index("case_id")
    selected = noisy_in(out)
    assert {row["case_id"]: selected(row) for row in read_table(out).rows} == {
        case_id: case_id == slow_case for case_id in before.index}
    again = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots",
                                     "--retry-noisy"])
    assert again.exit_code == 0, again.output
    after = pd.read_csv(out / RESULTS_FILE).set_index("case_id")
    assert len(after) == 2
    for case_id, old in before.iterrows():
        remeasured = after.loc[case_id, "probe_ms"] != old.probe_ms
        assert remeasured is (case_id == slow_case), case_id


#: a CPU hog on CPU 0 at real-time priority that spins 450 us and sleeps 50 us, over and
#: over: any normal process on CPU 0 runs only in its 50 us gaps, so everything it does takes
#: about ten times longer (the kernel keeps 5% of each second from real-time tasks). A
#: time-shared hog would not do: it hands the 0.5 ms probe whole scheduler slices of
#: milliseconds, and the probe's median of 7 calls barely moves (0.49 -> 0.62 ms with four
#: hogs on its core). It stops when its parent goes, and after 120 s whatever happens.
HOG = r"""
import os, sys, time
os.sched_setaffinity(0, {0})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError as err:
    print(f"no real-time priority here ({err})", flush=True)
    sys.exit(0)
print("running", flush=True)
parent, end, clock = os.getppid(), time.monotonic() + 120, time.perf_counter
while time.monotonic() < end and os.getppid() == parent:
    until = clock() + 450e-6
    while clock() < until:
        pass
    time.sleep(50e-6)
"""


#: a sweep on CPU 0 only (its driver, forkserver and workers): N=16 on a quiet core, then
#: N=32 (a resume) with the hog on the core, then ``retry_noisy`` on a quiet core again; the
#: run directory is copied after each step
SWEEP = r"""
import json, os, shutil, subprocess, sys
from pathlib import Path
os.sched_setaffinity(0, {0})
from bench.runner import load_run
from bench.speed.sweep import run_sweep

config, out, hog = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
run_sweep(load_run({**config, "seq_len": [16]}), out)
shutil.copytree(out, out.parent / "quiet")
competitor = subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE, text=True)
try:
    state = competitor.stdout.readline().strip()
    if state != "running":
        print(json.dumps({"skip": state}))
        sys.exit(0)
    run_sweep(load_run(config), out)
finally:
    competitor.kill()
    competitor.wait()
shutil.copytree(out, out.parent / "slow")
run_sweep(load_run(config), out, retry_noisy=True)
print(json.dumps({"done": True}))
"""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(600)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not hasattr(os, "SCHED_FIFO"),
                    reason="needs Linux CPU affinity and real-time scheduling")
def test_a_worker_really_slowed_for_its_whole_case_is_flagged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", SWEEP, json.dumps(_slow_config(repeats=5, min_repeats=5)),
                           str(out), HOG], capture_output=True, text=True, timeout=540,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in said:
        pytest.skip(said["skip"])
    quiet = pd.read_csv(tmp_path / "quiet" / RESULTS_FILE).iloc[0]
    slow = pd.read_csv(tmp_path / "slow" / RESULTS_FILE).set_index("seq_len")
    quiet_probe = min(json.loads(quiet.probe_ms))
    slow_probe = probe_level(json.loads(slow.loc[32, "probe_ms"]))
    print(f"quiet probe {json.loads(quiet.probe_ms)} ms, slow probe {json.loads(slow.loc[32, 'probe_ms'])} ms "
          f"({slow_probe / quiet_probe:.1f}x); times {slow.loc[32, 'times_ms']} ms, spread "
          f"{slow.loc[32, 'time_spread']:.1%}")
    # the quiet row's own flag is its spread and probe change only (a probe on a shared core may
    # move past the threshold by itself); the driver added no slow state to it
    assert bool(quiet.noisy) == bool(row_verdict(quiet)) == bool(slow.loc[16, "noisy"])
    # the driver flagged N=32 as it arrived, against the quiet row before it; reading says why
    assert bool(slow.loc[32, "noisy"]) is True
    df = load_results(tmp_path / "slow").set_index("seq_len")
    quiet_levels = quiet_probes(df.reset_index().itertuples())
    verdict = row_verdict(df.loc[32], quiet_levels)
    assert f"slow state: probe {slow_probe:.3g} ms against the run's quiet {quiet_probe:.3g} ms" in verdict
    assert "slow state" not in row_verdict(df.loc[16], quiet_levels)
    # --retry-noisy measured it again, on the quiet core: no longer slow
    again = pd.read_csv(out / RESULTS_FILE).set_index("seq_len")
    assert again.loc[32, "probe_ms"] != slow.loc[32, "probe_ms"]
    assert probe_level(json.loads(again.loc[32, "probe_ms"])) < SLOW_STATE_FACTOR * quiet_probe
    assert "slow state" not in row_verdict(again.loc[32], quiet_probes(read_table(out).rows))
