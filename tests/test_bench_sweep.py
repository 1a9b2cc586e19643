"""Sweeps are resumable: a sweep killed mid-way and rerun gives exactly the rows of a clean run."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import alive, wait_for
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.fsutil import RunLock, RunLockedError
from bench.engine.results import RESULTS_FILE, read_rows
from bench.engine.row_schema import COLUMNS
from bench.runner import load_run
from bench.speed.results import load_results
from bench.speed.sweep import MixedEnvironmentError, run_sweep

ROOT = Path(__file__).resolve().parents[1] if (Path(__file__).parents[1] / "bench").exists() \
    else Path(__file__).parents[1]
LENGTHS = [16, 32, 48, 64, 80, 96]


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump({
        "name": "resume", "passes": ["fwd", "fwd_bwd"], "seq_len": LENGTHS, "heads": 1,
        "head_dim": 8, "repeats": 2, "timeout_s": 20, "plugins": ["bench.engine.testing"],
        "peak_matmul_size": 256,
        "variants": [{"name": "bench_sleep", "seconds": 0.02}],
    }))
    return path


def _sweep(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.cli", "sweep", str(config), "--out", str(out),
           "--no-plots", *extra]
    return subprocess.Popen(cmd, cwd=Path.cwd() if (Path.cwd() / "bench").exists() else ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _keys(out: Path) -> list[tuple[str, str]]:
    return [(r["case_id"], r["pass"]) for r in read_rows(out)]


@pytest.mark.slow  # 40 s: four sweeps; resuming damaged and failed runs stays in the default run (below)
def test_killed_sweep_resumes_to_the_rows_of_a_clean_run(tmp_path):
    config = _config(tmp_path)
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    proc = _sweep(config, clean)
    victim = _sweep(config, killed)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill once at least two cases are recorded
        if len(read_rows(killed)) >= 4 or victim.poll() is not None:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the sweep finished before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    partial = _keys(killed)
    assert 4 <= len(partial) < 2 * len(LENGTHS)
    with (killed / RESULTS_FILE).open("a") as f:  # as if killed in the middle of a write
        f.write(partial[0][0] + ",bench_sleep,bench_sl")
    assert proc.wait(timeout=180) == 0, proc.stdout.read().decode()
    rerun = _sweep(config, killed, "--resume")
    assert rerun.wait(timeout=180) == 0, rerun.stdout.read().decode()
    resumed = _keys(killed)
    assert len(resumed) == len(set(resumed)) == 2 * len(LENGTHS)
    assert set(resumed) == set(_keys(clean))
    assert resumed[: len(partial)] == partial  # finished rows kept, in place
    # a third run finds nothing to do and changes nothing
    again = _sweep(config, killed)
    assert again.wait(timeout=120) == 0
    assert _keys(killed) == resumed
    df = load_results(killed)
    assert (df.status == "ok").all() and sorted(df.seq_len.unique()) == LENGTHS


def test_dry_run_lists_cases_and_marks_finished_ones(tmp_path):
    config = _config(tmp_path)
    proc = _sweep(config, tmp_path / "out", "--dry-run")
    assert proc.wait(timeout=60) == 0
    text = proc.stdout.read().decode()
    assert f"{len(LENGTHS)} cases, 0 already done" in text
    assert text.count("todo bench_sleep(seconds=0.02) [auto]") == len(LENGTHS)
    assert not (tmp_path / "out" / RESULTS_FILE).exists()


# A case's identity includes everything that changes its measurement: a rerun into the same run
# directory with another thread count is refused in one line naming the setting (old and new value).
def _settings_config(**extra) -> dict:
    return {"name": "settings", "passes": ["fwd"], "seq_len": [16], "heads": 1, "head_dim": 8,
            "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
            "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}],
            **extra}


@pytest.fixture
def _unregister_settings():
    from bench.engine.testing import unregister_test_variants

    yield
    unregister_test_variants()


@pytest.mark.usefixtures("_unregister_settings")
def test_a_rerun_with_another_thread_count_is_refused_not_reused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_sweep(load_run(_settings_config(threads=1)), out)
    before = (out / RESULTS_FILE).read_text()
    assert run_sweep(load_run(_settings_config(threads=1)), out) == []  # same setting: nothing new
    with pytest.raises(MixedEnvironmentError, match=r"threads 1 -> 2"):
        run_sweep(load_run(_settings_config(threads=2)), out)
    assert (out / RESULTS_FILE).read_text() == before


@pytest.mark.usefixtures("_unregister_settings")
def test_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(_settings_config(threads=1)))
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert first.exit_code == 0, first.output
    config.write_text(yaml.safe_dump(_settings_config(threads=2)))
    again = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert again.exit_code == 2, again.output
    line, = again.output.strip().splitlines()
    assert "threads 1 -> 2" in line


@pytest.mark.usefixtures("_unregister_settings")
def test_the_dry_run_says_what_the_run_does(tmp_path: Path) -> None:
    """A dry run with another thread count is refused with the run's line, not listed as
    done; with --allow-mixed both keep the rows; the same setting lists every case done."""
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(_settings_config(threads=1)))
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out)]
    assert CliRunner().invoke(app, [*args, "--no-plots"]).exit_code == 0
    same = CliRunner().invoke(app, [*args, "--dry-run"])
    assert same.exit_code == 0 and "1 case, 1 already done" in same.output, same.output
    config.write_text(yaml.safe_dump(_settings_config(threads=2)))
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    real = CliRunner().invoke(app, [*args, "--no-plots"])
    assert dry.exit_code == real.exit_code == 2, (dry.output, real.output)
    assert dry.output == real.output and "threads 1 -> 2" in dry.output
    mixed = CliRunner().invoke(app, [*args, "--dry-run", "--allow-mixed"])
    assert mixed.exit_code == 0 and "1 case, 1 already done" in mixed.output, mixed.output


# No fault loses, mixes or hides a result: signals to the driver, hung workers and their children,
# mixed environments on resume, torn files, two sweeps into one directory.
def _faults_config(**extra) -> dict:
    return {"name": "faults", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
            "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"], "peak_matmul_size": 128,
            "variants": [{"name": "bench_sleep", "seconds": 0.01}], **extra}


@pytest.fixture
def sweep_config():
    from bench.engine.testing import unregister_test_variants

    yield lambda **extra: load_run(_faults_config(**extra))
    unregister_test_variants()


def _start_hanging_sweep(tmp_path: Path, how: str = "spawn") -> tuple[subprocess.Popen, Path]:
    pidfile = tmp_path / "pids"
    config = tmp_path / "hang.yaml"
    config.write_text(yaml.safe_dump(_faults_config(
        timeout_s=300, seq_len=[16],
        variants=[{"name": "bench_crash", "how": how, "pidfile": str(pidfile)}])))
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "sweep", str(config), "--out",
                             str(tmp_path / "out"), "--no-plots"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) >= 2
                     if how == "spawn" else pidfile.exists(), 60), "the worker never started"
    return proc, pidfile


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow),
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
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


@pytest.mark.slow  # an end-to-end run: in the full suite
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
