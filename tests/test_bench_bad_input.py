"""Bad input anywhere the CLI takes it is one line ``error: ...`` naming the argument, exit
code 2, no traceback; ``attn-bench --debug ...`` shows the traceback instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_bench_scaling import write_run
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.fsutil import RunLock
from bench.engine.results import ResultsWriter

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "attn_bench_broken_plugin"
runner = CliRunner()
#: a small real sweep, in case a check let the input through (it would run, not hang)
TINY = ["--variant", "full", "--seq-len", "16", "--kernel", "reference", "--pass", "fwd",
        "--repeats", "1"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: good and bad run directories, a broken plug-in, a file, YAML configs."""
    root = tmp_path_factory.mktemp("bad_input")
    write_run(root / "run_a")
    write_run(root / "run_b")
    (root / "header_only").mkdir()
    ResultsWriter(root / "header_only")
    (root / "not_a_run").mkdir()
    for name in ("env", "sweep", "peak"):
        write_run(root / f"bad_{name}")
        (root / f"bad_{name}" / f"{name}.json").write_text("{not json")
    (root / "plugins").mkdir()
    (root / "plugins" / f"{PLUGIN}.py").write_text("def (\n")
    (root / "a_file").write_text("not a directory")
    (root / "cuda.yaml").write_text(
        "name: c\ndevice: cuda\nseq_len: [16]\npasses: [fwd]\nvariants: [full]\n")
    (root / "no_cases.yaml").write_text(
        "name: e\nseq_len: [16]\nkernels: [blocked]\nvariants: [nystrom]\n")
    return root


# (id, arguments with {ws} for the workspace, a fragment the one line must contain)
CASES = [
    # sweep overrides are validated like the YAML
    ("seq-len", "sweep quick --dry-run --seq-len 0", "--seq-len"),
    ("kernel", "sweep quick --dry-run --kernel bogus", "--kernel: unknown value 'bogus'"),
    ("threads", "sweep quick --dry-run --threads -1", "--threads"),
    ("repeats", "sweep quick --dry-run --repeats 0", "--repeats"),
    ("pass", "sweep quick --dry-run --pass backward", "--pass: unknown value 'backward'"),
    ("dtype", "sweep quick --dry-run --dtype fp32", "--dtype: unknown value 'fp32'"),
    ("device", "sweep quick --dry-run --device tpu", "--device: unknown value 'tpu'"),
    ("timeout", "sweep quick --dry-run --timeout-s 0", "--timeout-s"),
    ("variant", "sweep quick --dry-run --variant no_such_variant", "--variant: unknown variant"),
    ("kernel-lacking", "sweep quick --dry-run --variant nystrom --kernel blocked",
     "--kernel: the sweep has no cases"),
    ("kernel-lacking-run", "sweep quick --out {ws}/o1 --variant nystrom --kernel blocked",
     "--kernel: the sweep has no cases"),
    ("empty-yaml", "sweep {ws}/no_cases.yaml --dry-run", "config key 'kernels': the sweep has no cases"),
    ("executor", "sweep quick --dry-run --executor bogus", "--executor: unknown value 'bogus'"),
    ("address", "sweep quick --out {ws}/o2 --address 1.2.3.4:6379 " + " ".join(TINY), "--address"),
    ("seq-len-type", "sweep quick --dry-run --seq-len abc", "'--seq-len'"),
    # list
    ("list-dtype", "list --dtype bfloat17", "--dtype: unknown value 'bfloat17'"),
    ("list-device", "list --device tpu", "--device: unknown value 'tpu'"),
    # run directories
    ("report-header-only", "report {ws}/header_only", "RUN_DIR"),
    ("report-missing", "report {ws}/nothing", "RUN_DIR"),
    ("report-not-run", "report {ws}/not_a_run", "RUN_DIR"),
    ("plot-missing", "plot {ws}/nothing", "RUN_DIR"),
    ("plot-not-run", "plot {ws}/not_a_run", "RUN_DIR"),
    ("compare-missing", "compare {ws}/nothing {ws}/run_b", "RUN_A"),
    ("compare-not-run", "compare {ws}/run_a {ws}/not_a_run", "RUN_B"),
    ("report-points", "report {ws}/run_a --points 1", "'--points'"),
    ("report-fit-range", "report {ws}/run_a --fit-range 10:5", "--fit-range"),
    ("compare-negative", "compare {ws}/run_a {ws}/run_b --fail-if-regression -5",
     "--fail-if-regression"),
    ("compare-abs", "compare {ws}/run_a {ws}/run_b --abs-threshold-ms -1", "--abs-threshold-ms"),
    # corrupt JSON in a run directory
    ("report-env-json", "report {ws}/bad_env", "env.json"),
    ("report-sweep-json", "report {ws}/bad_sweep", "sweep.json"),
    ("resume-env-json", "sweep quick --out {ws}/bad_env --allow-mixed " + " ".join(TINY), "env.json"),
    ("resume-peak-json", "sweep quick --out {ws}/bad_peak --allow-mixed " + " ".join(TINY),
     "peak.json"),
    # check
    ("check-param-yaml", "check sliding_window --param window=[", "--param window"),
    ("check-param-form", "check sliding_window --param nokey", "--param"),
    ("check-param-key", "check sliding_window --param windw=3", "--param windw"),
    ("check-param-value", "check sliding_window --param window=-1", "--param"),
    ("check-name", "check no_such_variant", "NAME: unknown attention"),
    ("check-kernel", "check sliding_window --kernel bogus", "--kernel"),
    ("check-device", "check sliding_window --device tpu", "--device"),
    # --out that cannot be written
    ("out-is-file", "sweep quick --out {ws}/a_file " + " ".join(TINY), "--out"),
    ("out-under-file", "sweep quick --out {ws}/a_file/sub " + " ".join(TINY), "--out"),
    ("decoding-out-is-file", "decoding --out {ws}/a_file --context 16", "--out"),
    # plug-ins
    ("plugin-syntax", f"sweep quick --dry-run --plugin {PLUGIN}", "--plugin"),
    ("plugin-missing", "sweep quick --dry-run --plugin no_such_module_xyz", "--plugin"),
    ("list-plugin", f"list --plugin {PLUGIN}", "--plugin"),
    ("check-plugin", "check full --plugin no_such_module_xyz", "--plugin"),
    # decoding
    ("decoding-context", "decoding --out {ws}/dec --context 0", "'--context'"),
    ("decoding-new-tokens", "decoding --out {ws}/dec --new-tokens 0", "'--new-tokens'"),
    ("decoding-attention", "decoding --out {ws}/dec --attention no_such_variant", "--attention"),
    ("decoding-not-causal", "decoding --out {ws}/dec --attention nystrom", "--attention: 'nystrom'"),
    ("decoding-window", "decoding --out {ws}/dec --window -1", "'--window'"),
    ("decoding-threads", "decoding --out {ws}/dec --threads 0", "'--threads'"),
    ("decoding-heads", "decoding --out {ws}/dec --d-model 30", "--d-model"),
]
CUDA_CASES = [
    ("sweep-cuda", "sweep quick --out {ws}/o3 --device cuda " + " ".join(TINY), "--device: cuda"),
    ("yaml-cuda", "sweep {ws}/cuda.yaml --out {ws}/o4", "config key 'device': cuda"),
    ("check-cuda", "check sliding_window --device cuda", "--device: cuda"),
]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_one_line_error(exit_code: int, output: str, fragment: str) -> None:
    """Exit 2, one non-empty line ``error: ...`` containing ``fragment``, no traceback."""
    lines = _lines(output)
    assert exit_code == 2, output
    assert len(lines) == 1, output
    assert lines[0].startswith("error:") and fragment in lines[0], output
    assert "Traceback" not in output


def _invoke(ws: Path, args: str, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(ws)  # defaults such as runs/<name> stay inside the workspace
    monkeypatch.syspath_prepend(str(ws / "plugins"))
    result = runner.invoke(app, args.format(ws=ws).split())
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(ws, args, fragment, monkeypatch):
    assert_one_line_error(*_invoke(ws, args, monkeypatch), fragment)


@no_cuda
@pytest.mark.parametrize(("args", "fragment"), [c[1:] for c in CUDA_CASES],
                         ids=[c[0] for c in CUDA_CASES])
def test_cuda_without_cuda_is_one_line_before_any_case_runs(ws, args, fragment, monkeypatch):
    assert_one_line_error(*_invoke(ws, args, monkeypatch), fragment)
    assert not (ws / "o3" / "results.csv").exists() and not (ws / "o4" / "results.csv").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_out_under_a_read_only_directory(ws, monkeypatch):
    locked = ws / "read_only"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code, output = _invoke(ws, "sweep quick --out {ws}/read_only/sub " + " ".join(TINY),
                               monkeypatch)
    finally:
        locked.chmod(0o755)
    assert_one_line_error(code, output, "--out")


def test_resume_into_another_environment_names_the_difference(ws, monkeypatch):
    out = ws / "mixed"
    out.mkdir()
    rows = [{"case_id": "x", "label": "full", "variant": "full", "kernel_requested": "auto",
             "seq_len": 8, "pass": "fwd", "status": "ok", "time_ms": 1.0, "git_sha": "0123abc",
             "timestamp": "2026-01-01T00:00:00"}]
    ResultsWriter(out).append(rows)
    code, output = _invoke(ws, "sweep quick --out {ws}/mixed " + " ".join(TINY), monkeypatch)
    assert_one_line_error(code, output, "git_sha 0123abc -> ")
    assert "--allow-mixed" in output


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_locked_run_directory_names_the_holder(ws):
    """A second process sweeping into a directory this one holds is refused in one line."""
    out = ws / "locked"
    with RunLock(out):
        done = _cli("sweep", "quick", "--out", str(out), *TINY, cwd=ws)
    assert_one_line_error(done.returncode, done.stdout + done.stderr,
                          f"in use by another sweep (pid {os.getpid()}")
    assert "--out" in done.stderr


def test_a_real_process_prints_one_line_for_click_errors(ws):
    done = _cli("decoding", "--out", str(ws / "dec"), "--context", "0", cwd=ws)
    assert_one_line_error(done.returncode, done.stdout + done.stderr, "'--context'")


def test_debug_shows_the_traceback(ws):
    done = _cli("--debug", "report", str(ws / "not_a_run"), cwd=ws)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "not a run directory" in done.stderr
    plain = _cli("report", str(ws / "not_a_run"), cwd=ws)
    assert_one_line_error(plain.returncode, plain.stdout + plain.stderr, "RUN_DIR")
