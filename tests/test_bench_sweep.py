"""Sweeps are resumable: a sweep killed mid-way and rerun gives exactly the rows of a clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.engine.results import RESULTS_FILE, read_rows
from bench.speed.results import load_results

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


@pytest.mark.slow  # 40 s: four sweeps; resuming damaged and failed runs stays in the default run (test_bench_faults)
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
