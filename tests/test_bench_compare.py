"""``attn-bench compare``: every case is classified, and the gate fails when cases stop working,
disappear or get slower beyond the absolute threshold, the relative one and the noise."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.provenance import CPU_FLAGS, cpu_summary, environment
from bench.engine.results import ResultsWriter, write_env
from bench.speed.compare import class_counts, classify_case, classify_runs, gate_failures

runner = CliRunner()


def _row(n: int, status: str = "ok", time_ms: float = 10.0, iqr_ms: float = 0.0,
         label: str = "full", kernel: str = "sdpa") -> dict:
    ok = status == "ok"
    return {
        "case_id": f"{label}-{kernel}-{n}", "label": label, "variant": label,
        "kernel_requested": kernel, "kernel": kernel, "params": "{}", "seq_len": n, "batch": 1,
        "heads": 8, "head_dim": 64, "dtype": "float32", "device": "cpu", "causal": False,
        "pass": "fwd", "status": status, "reason": "" if ok else "timed out",
        "time_ms": time_ms if ok else None, "time_iqr_ms": iqr_ms if ok else None,
        "repeats": 5 if ok else None, "timestamp": "2026-01-01T00:00:00",
    }


def _run(path, rows):
    path.mkdir()
    ResultsWriter(path).append(rows)
    return path


def _compare(a, b, *options):
    result = runner.invoke(app, ["compare", str(a), str(b), *options])
    return result.exit_code, result.output


LENGTHS = [256, 512, 1024, 2048, 4096, 8192]


def test_five_of_six_cases_going_from_ok_to_timeout_fail_the_gate(tmp_path):
    a = _run(tmp_path / "a", [_row(n) for n in LENGTHS])
    b = _run(tmp_path / "b", [_row(256)] + [_row(n, "timeout") for n in LENGTHS[1:]])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 1, output
    assert "6 cases: broken 0, newly failing 5, lost 0, worse 0, better 0, fixed 0, new 0, unchanged 1" in output
    assert "regression gate failed: 5 newly failing" in output
    assert output.count("| newly failing |") == 5  # each one in the table


def test_a_lost_case_fails(tmp_path):
    a = _run(tmp_path / "a", [_row(256), _row(512)])
    b = _run(tmp_path / "b", [_row(256)])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 1 and "1 lost" in output and "| lost |" in output


def test_a_new_case_alone_passes_and_is_reported(tmp_path):
    a = _run(tmp_path / "a", [_row(256)])
    b = _run(tmp_path / "b", [_row(256), _row(512)])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 0, output
    assert "new 1" in output and "| new |" in output and "no regression" in output


def test_a_fixed_case_passes_and_is_reported(tmp_path):
    a = _run(tmp_path / "a", [_row(256), _row(512, "oom")])
    b = _run(tmp_path / "b", [_row(256), _row(512)])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 0 and "fixed 1" in output and "| fixed |" in output


def test_a_slowdown_within_the_noise_passes(tmp_path):
    """20 ms slower (20%), but half of each IQR (15 + 15 ms) is larger: noise, not a change."""
    a = _run(tmp_path / "a", [_row(256, time_ms=100.0, iqr_ms=30.0)])
    b = _run(tmp_path / "b", [_row(256, time_ms=120.0, iqr_ms=30.0)])
    code, output = _compare(a, b, "--fail-if-regression", "5")
    assert code == 0 and "unchanged 1" in output, output
    tight = _run(tmp_path / "c", [_row(256, time_ms=120.0, iqr_ms=2.0)])
    code, output = _compare(_run(tmp_path / "d", [_row(256, time_ms=100.0, iqr_ms=2.0)]), tight,
                            "--fail-if-regression", "5")
    assert code == 1 and "1 worse" in output


def test_a_slowdown_above_both_thresholds_fails(tmp_path):
    a = _run(tmp_path / "a", [_row(256, time_ms=100.0), _row(512, time_ms=200.0)])
    b = _run(tmp_path / "b", [_row(256, time_ms=120.0), _row(512, time_ms=200.0)])
    code, output = _compare(a, b, "--fail-if-regression", "10", "--abs-threshold-ms", "5")
    assert code == 1 and "worse 1" in output and "regression gate failed: 1 worse" in output
    assert "| worse | full | sdpa | fwd | 256 |" in output
    # the same slowdown under a 25% gate, or a 25 ms floor, passes
    assert _compare(a, b, "--fail-if-regression", "25")[0] == 0
    assert _compare(a, b, "--fail-if-regression", "10", "--abs-threshold-ms", "25")[0] == 0


def test_a_slowdown_below_the_absolute_threshold_passes(tmp_path):
    """0.5 -> 0.9 ms is 80% slower but only 0.4 ms: below the default 1 ms floor."""
    a = _run(tmp_path / "a", [_row(256, time_ms=0.5)])
    b = _run(tmp_path / "b", [_row(256, time_ms=0.9)])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 0 and "unchanged 1" in output, output
    code, output = _compare(a, b, "--fail-if-regression", "10", "--abs-threshold-ms", "0.1")
    assert code == 1 and "worse 1" in output


def test_a_speedup_is_better_and_passes(tmp_path):
    a = _run(tmp_path / "a", [_row(256, time_ms=100.0)])
    b = _run(tmp_path / "b", [_row(256, time_ms=50.0)])
    code, output = _compare(a, b, "--fail-if-regression", "10")
    assert code == 0 and "better 1" in output and "| better |" in output


@pytest.mark.parametrize("gate", [["--fail-if-regression", "10"], []])
def test_nothing_matching_fails(tmp_path, gate):
    a = _run(tmp_path / "a", [_row(256)])
    b = _run(tmp_path / "b", [_row(512)])
    code, output = _compare(a, b, *gate)
    assert code == 1, output
    assert "lost 1" in output and "new 1" in output
    assert "no case is ok in both runs" in output


def test_cases_failing_in_both_runs_compare_nothing(tmp_path):
    a = _run(tmp_path / "a", [_row(256, "timeout")])
    b = _run(tmp_path / "b", [_row(256, "timeout")])
    table = classify_runs(a, b)
    assert class_counts(table)["unchanged"] == 1
    assert gate_failures(table) == ["no case is ok in both runs (1 case(s) in both), so nothing "
                                    "was compared"]


def test_rows_match_on_the_whole_key(tmp_path):
    """Another kernel, dtype or shape is another case, never compared with this one."""
    a = _run(tmp_path / "a", [_row(256), _row(256, kernel="reference")])
    b = _run(tmp_path / "b", [_row(256), {**_row(256, kernel="reference"), "dtype": "float64"}])
    counts = class_counts(classify_runs(a, b))
    assert (counts["unchanged"], counts["lost"], counts["new"]) == (1, 1, 1)


@pytest.mark.parametrize(("a", "b", "noise", "expected"), [
    (10.0, 11.0, 0.0, "unchanged"),  # +1 ms exactly: not more than the 1 ms floor
    (10.0, 11.5, 0.0, "worse"),
    (10.0, 11.5, 1.6, "unchanged"),  # within the noise
    (100.0, 104.0, 0.0, "unchanged"),  # 4 ms but only 4% < 5%
    (100.0, 94.0, 0.0, "better"),
])
def test_the_rule_needs_all_three_margins(a, b, noise, expected):
    assert classify_case("ok", "ok", a, b, noise, rel_pct=5.0, abs_ms=1.0) == expected


def test_statuses_decide_before_times():
    assert classify_case("ok", None, 1.0, float("nan"), 0.0, 5.0, 1.0) == "lost"
    assert classify_case(None, "ok", float("nan"), 1.0, 0.0, 5.0, 1.0) == "new"
    assert classify_case("ok", "killed", 1.0, float("nan"), 0.0, 5.0, 1.0) == "newly failing"
    assert classify_case("error", "ok", float("nan"), 1.0, 0.0, 5.0, 1.0) == "fixed"
    assert classify_case("oom", "timeout", float("nan"), float("nan"), 0.0, 5.0, 1.0) == "unchanged"


def test_help_states_the_rule():
    output = " ".join(runner.invoke(app, ["compare", "--help"]).output.split())
    for fragment in ("--abs-threshold-ms", "PCT percent", "IQR", "newly failing", "lost"):
        assert fragment in output


def test_runs_recorded_before_labels_named_defaults_still_match(tmp_path):
    # An older run labelled `nystrom(num_landmarks=64)` (defaults left out) and a newer one
    # labelled with every pattern parameter are the same cases: they are compared, not
    # reported as "lost" and "new".
    def nystrom(n: int, label: str, time_ms: float) -> dict:
        return {**_row(n, time_ms=time_ms), "case_id": f"ny-{n}", "label": label,
                "variant": "nystrom", "kernel_requested": "native", "kernel": "native",
                "params": '{"num_landmarks": 64}'}

    old = _run(tmp_path / "old", [nystrom(n, "nystrom(num_landmarks=64)", 10.0) for n in LENGTHS])
    new = _run(tmp_path / "new", [nystrom(n, "nystrom(num_landmarks=64, pinv_iters=6)", 10.0)
                                  for n in LENGTHS])
    table = classify_runs(old, new)
    assert set(table.label) == {"nystrom(num_landmarks=64, pinv_iters=6)"}
    assert set(table["class"]) == {"unchanged"}


def test_compare_says_when_the_runs_come_from_different_cpus(tmp_path):
    epyc = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "device_name": "AMD EPYC"}
    xeon = {"cpu_model": "Intel Xeon", "cpu_capability": "AVX512", "device_name": "Intel Xeon"}
    runs = {}
    for name, cpu in (("a", epyc), ("b", xeon), ("c", epyc)):
        runs[name] = _run(tmp_path / name, [_row(n) for n in LENGTHS])
        write_env(runs[name], [cpu])
    _, output = _compare(runs["a"], runs["b"])
    assert ("note: the runs come from different machines (A: AMD EPYC AVX2; B: Intel Xeon AVX512): "
            "a change may be the machine, not the code") in output
    _, same = _compare(runs["a"], runs["c"])
    assert "different machines" not in same


def test_a_run_records_the_cpu_its_figures_hold_for():
    env = environment("cpu", 2)
    assert env["cpu_model"] and env["cpu_vendor"] and env["blas"]
    assert env["cpu_capability"] in {"DEFAULT", "NO AVX", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256"}
    assert set(env["cpu_flags"].split()) <= set(CPU_FLAGS)
    assert cpu_summary(env).startswith(env["cpu_model"]) and cpu_summary({}) == ""
