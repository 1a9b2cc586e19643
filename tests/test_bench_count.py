"""attn-bench count: instruction counts under callgrind, and a precise refusal without one."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.counting import counter


def test_count_refuses_naming_what_is_missing(tmp_path, monkeypatch):
    """Without valgrind the command exits 2 with one line naming valgrind and what perf lacks."""
    monkeypatch.setattr(counter.shutil, "which", lambda name: None)
    monkeypatch.setattr(counter, "PMU_DIR", tmp_path / "no-pmu")
    result = CliRunner().invoke(app, ["count", "full", "--seq-len", "16", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "count: no instruction counter on this machine: callgrind: valgrind is not installed" in message
    assert "perf stat -e instructions: the kernel exposes no hardware counters" in message
    assert not (tmp_path / "out" / "counts.csv").exists()


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="the kernel is checked after the counter")
def test_count_refuses_a_kernel_that_cannot_run_the_call(tmp_path):
    """Checked before callgrind starts: one line naming --kernel and the kernel's reason."""
    result = CliRunner().invoke(app, ["count", "full", "--kernel", "blocked", "--seq-len", "16",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--kernel: 'blocked' cannot run full at N=16:" in " ".join(result.output.split())


def test_perf_problem_names_the_paranoid_level(tmp_path, monkeypatch):
    pmu = tmp_path / "cpu"
    pmu.mkdir()
    paranoid = tmp_path / "paranoid"
    paranoid.write_text("3\n")
    monkeypatch.setattr(counter, "PMU_DIR", pmu)
    monkeypatch.setattr(counter, "PARANOID", paranoid)
    monkeypatch.setattr(counter.shutil, "which", lambda name: "/usr/bin/perf")
    assert "perf_event_paranoid is 3" in counter.perf_problem()
    paranoid.write_text("2\n")
    assert counter.perf_problem() is None


def test_count_bad_options_are_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["count", "full", "--kernel", "banded", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--kernel: 'full' has no kernel 'banded'" in result.output
    result = runner.invoke(app, ["count", "full", "--dtype", "float16", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--dtype: unknown value 'float16'" in result.output


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a few minutes under Valgrind, more beside other tests
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (apt-get install -y valgrind)")
def test_count_under_callgrind_is_deterministic_and_grows_with_length(tmp_path):
    """One counted process: the same length twice gives the same count per call (to 0.5%),
    a longer one more; the harness is subtracted; the kernel that ran is recorded."""
    # lengths where the kernel's work, not the allocator's bookkeeping, makes the count: at
    # N=32 (about 3e5 instructions a call) two counts of one length differed by 0.6%
    args = ["count", "full", "--kernel", "sdpa", "--seq-len", "256", "--seq-len", "256",
            "--seq-len", "1024", "--heads", "1", "--head-dim", "16", "--calls", "3", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "counts.csv")
    per_call = rows.instructions_per_call.tolist()
    assert per_call[0] > 0 and abs(per_call[1] / per_call[0] - 1) < 0.005
    assert per_call[2] > 1.5 * per_call[0]
    assert (rows.harness_total < rows.instructions_total).all() and (rows.kernel == "sdpa").all()
    assert "| 1024 | sdpa |" in (tmp_path / "summary.md").read_text()


def test_summary_names_the_call_and_each_length():
    from bench.counting.run import summary_markdown

    row = {"variant": "full", "params": "{}", "kernel_requested": "auto", "kernel": "sdpa",
           "path": "sdpa(fused, no mask)", "fallback": "", "seq_len": 64, "batch": 1, "heads": 2,
           "head_dim": 16, "dtype": "float64", "causal": True, "calls": 4,
           "instructions_per_call": 6400.0, "harness_total": 400, "counter_version": "valgrind-3.19.0"}
    text = summary_markdown(pd.DataFrame([row, {**row, "seq_len": 128, "fallback": "dense mask"}]),
                            {"git_sha": "abc"})
    assert "(1, 2, N, 16) float64, causal=True" in text
    assert "| 64 | sdpa | sdpa(fused, no mask) | 6,400 | 100 | 100 |" in text
    assert "| 128 | sdpa | sdpa(fused, no mask) (fallback: dense mask) | 6,400 | 50 | 100 |" in text


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="needs valgrind (apt-get install -y valgrind)")
def test_instrumentation_cannot_be_turned_on_outside_callgrind():
    """The probe fails loudly rather than count nothing when no callgrind runs it."""
    from bench.counting.counter import start_instrumentation

    with pytest.raises(RuntimeError, match="callgrind_control could not turn instrumentation on"):
        start_instrumentation(timeout_s=30)
