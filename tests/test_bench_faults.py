"""No fault loses, mixes or hides a result: signals to the driver, hung workers and their
children, mixed environments on resume, torn files, two sweeps into one directory."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from processes import alive, wait_for

from bench.engine.fsutil import RunLock, RunLockedError, atomic_write_text
from bench.engine.results import RESULTS_FILE, read_rows
from bench.engine.row_schema import COLUMNS
from bench.runner import load_run
from bench.speed.results import load_results
from bench.speed.sweep import MixedEnvironmentError, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def _config(**extra) -> dict:
    return {"name": "faults", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
            "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"], "peak_matmul_size": 128,
            "variants": [{"name": "bench_sleep", "seconds": 0.01}], **extra}


@pytest.fixture
def sweep_config():
    from bench.engine.testing import unregister_test_variants

    yield lambda **extra: load_run(_config(**extra))
    unregister_test_variants()






def _start_hanging_sweep(tmp_path: Path, how: str = "spawn") -> tuple[subprocess.Popen, Path]:
    pidfile = tmp_path / "pids"
    config = tmp_path / "hang.yaml"
    config.write_text(yaml.safe_dump(_config(
        timeout_s=300, seq_len=[16],
        variants=[{"name": "bench_crash", "how": how, "pidfile": str(pidfile)}])))
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "sweep", str(config), "--out",
                             str(tmp_path / "out"), "--no-plots"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) >= 2
                     if how == "spawn" else pidfile.exists(), 60), "the worker never started"
    return proc, pidfile


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_sigterm_or_sighup_stops_the_sweep_cleanly_and_kills_the_workers(tmp_path, signum):
    proc, pidfile = _start_hanging_sweep(tmp_path)
    pids = [int(p) for p in pidfile.read_text().split()]
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, output
    assert f"stopped by {signal.Signals(signum).name}" in output and "resume" in output
    assert wait_for(lambda: not any(alive(p) for p in pids), 10), "a worker or its child survived"


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_killed_driver_leaves_nothing_running(tmp_path):
    proc, pidfile = _start_hanging_sweep(tmp_path)
    pids = [int(p) for p in pidfile.read_text().split()]
    proc.kill()  # SIGKILL: no handler runs in the driver
    proc.wait()
    assert wait_for(lambda: not any(alive(p) for p in pids), 15), "a worker or its child survived"


def test_a_timed_out_workers_children_are_killed_with_it(tmp_path, sweep_config):
    pidfile = tmp_path / "pids"
    # the case's clock covers the worker's start too: 3 s was spent before the forward on a loaded machine
    config = sweep_config(timeout_s=10, seq_len=[16],
                          variants=[{"name": "bench_crash", "how": "spawn", "pidfile": str(pidfile)}])
    rows = run_sweep(config, tmp_path / "out")
    assert [r["status"] for r in rows] == ["timeout"]
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_resume_refuses_rows_from_another_environment_unless_allowed(tmp_path, sweep_config):
    out = tmp_path / "out"
    run_sweep(sweep_config(seq_len=[16]), out)
    rows = read_rows(out)
    for row in rows:  # as if measured on another commit with other threads
        row["git_sha"], row["threads"] = "0123abc", "7"
    with (out / RESULTS_FILE).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    before = (out / RESULTS_FILE).read_text()
    with pytest.raises(MixedEnvironmentError, match=r"git_sha 0123abc -> .*threads 7 -> "):
        run_sweep(sweep_config(), out)
    assert (out / RESULTS_FILE).read_text() == before  # untouched
    run_sweep(sweep_config(), out, allow_mixed=True)
    df = load_results(out)
    assert sorted(df.seq_len) == [16, 32] and set(df.git_sha) >= {"0123abc"}
    from bench.speed.report import build_report

    text = build_report(out)
    assert "Rows from more than one environment" in text and "0123abc" in text


def test_retry_failed_reruns_only_what_failed(tmp_path, sweep_config):
    out = tmp_path / "out"
    run_sweep(sweep_config(), out)
    rows = read_rows(out)
    rows[1]["status"], rows[1]["reason"] = "timeout", "timed out after 1 s in pass fwd"
    with (out / RESULTS_FILE).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    assert run_sweep(sweep_config(), out) == []  # plain resume: nothing to do
    new = run_sweep(sweep_config(), out, retry_failed=True)
    assert [(r["case_id"], r["status"]) for r in new] == [(rows[1]["case_id"], "ok")]
    after = read_rows(out)
    assert after[0] == rows[0]  # the good row is kept as it was
    assert [r["status"] for r in after] == ["ok", "ok"]


@pytest.mark.parametrize("damage", ["empty", "torn_first_row", "torn_header"])
def test_a_damaged_results_file_is_repaired_on_resume(tmp_path, sweep_config, damage):
    out = tmp_path / "out"
    out.mkdir()
    header = ",".join(COLUMNS) + "\n"
    text = {"empty": "", "torn_first_row": header + "0123456789abcdef,bench_sl",
            "torn_header": header[:20]}[damage]
    (out / RESULTS_FILE).write_text(text)
    run_sweep(sweep_config(), out)
    lines = (out / RESULTS_FILE).read_text().splitlines()
    assert lines[0] == header.strip() and len(lines) == 3  # header + one row per length
    assert (load_results(out).status == "ok").all()


def test_a_second_sweep_into_the_same_directory_refuses(tmp_path, sweep_config):
    out = tmp_path / "out"
    with RunLock(out), pytest.raises(RunLockedError, match=rf"in use by another sweep \(pid {os.getpid()}"):
        run_sweep(sweep_config(), out)
    assert run_sweep(sweep_config(), out)  # the lock is gone with its holder


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    path.write_text("old")

    def fail(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]
