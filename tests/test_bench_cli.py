"""The ``attn-bench`` command line: help everywhere, clear errors, compare exit codes, check."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_bench_scaling import write_run
from typer.testing import CliRunner

from attn import create_attention
from bench.cli import app
from bench.cli.variants import auto_by_length
from bench.engine.fsutil import RunLock
from bench.engine.results import ResultsWriter

runner = CliRunner()
COMMANDS = ["list", "sweep", "plot", "report", "compare", "history", "check", "decoding", "decoding-step",
            "approx-error", "count", "reproduce"]


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_everywhere(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_list_shows_variants_kernels_and_support():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    for name in ("full", "sliding_window", "nystrom", "reference", "sdpa", "quick"):
        assert name in result.output


def test_bad_config_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nseq_len: [8]\nvariants: [{name: sliding_window, windw: 3}]\n")
    result = runner.invoke(app, ["sweep", str(bad), "--dry-run"])
    assert result.exit_code == 2
    assert "variants[0].windw" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["sweep", "no-such-preset", "--dry-run"])
    assert result.exit_code == 2 and "presets are" in result.output


def test_dry_run_with_overrides(tmp_path):
    result = runner.invoke(app, ["sweep", "scaling-cpu", "--out", str(tmp_path / "o"),
                                 "--dry-run", "--variant", "full", "--seq-len", "64",
                                 "--seq-len", "128", "--kernel", "auto"])
    assert result.exit_code == 0, result.output
    assert "2 cases, 0 already done" in result.output
    assert "full [auto] N=64" in result.output and "N=128" in result.output


def test_report_plot_and_compare_commands(tmp_path):
    base, slower = write_run(tmp_path / "a"), write_run(tmp_path / "b", slow_factor=1.3)
    assert "## Scaling" in runner.invoke(app, ["report", str(base)]).output
    assert runner.invoke(app, ["plot", str(base)]).exit_code == 0
    assert (base / "scaling.png").exists()
    ok = runner.invoke(app, ["compare", str(base), str(slower), "--fail-if-regression", "50"])
    assert ok.exit_code == 0 and "no regression" in ok.output
    bad = runner.invoke(app, ["compare", str(base), str(slower), "--fail-if-regression", "10"])
    assert bad.exit_code == 1
    # full is 30% slower; from N=2048 on that is also more than the 1 ms floor (fwd, fwd_bwd)
    assert "worse 6" in bad.output and "regression gate failed: 6 worse" in bad.output
    assert bad.output.count("| worse | full | auto |") == 6
    ranged = runner.invoke(app, ["report", str(base), "--fit-range", "512:2048"])
    assert ranged.exit_code == 0 and "Exponents over N = 512..2048" in ranged.output
    bad_range = runner.invoke(app, ["report", str(base), "--fit-range", "2048-512"])
    assert bad_range.exit_code == 2 and "--fit-range must be LO:HI" in bad_range.output
    missing = runner.invoke(app, ["report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "not a run directory" in missing.output


def test_check_passes_a_correct_variant_and_fails_a_wrong_one():
    pytest.importorskip("attn.conformance")
    good = runner.invoke(app, ["check", "sliding_window", "--kernel", "sdpa"])
    assert good.exit_code == 0, good.output
    assert "0 failed" in good.output
    try:
        bad = runner.invoke(app, ["check", "bench_wrong", "--plugin", "bench.engine.testing"])
    finally:
        import sys

        from attn.registry import unregister_attention

        for name in ("bench_sleep", "bench_alloc", "bench_crash", "bench_wrong"):
            unregister_attention(name)
        sys.modules.pop("bench.engine.testing", None)
    assert bad.exit_code == 1
    assert "matches_reference" in bad.output and "FAIL" in bad.output


def test_list_is_readable_at_80_columns():
    """Every line fits 80 columns and no value is cut in two (``position_bias=N`` / ``one``),
    in a terminal or not."""
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    for whole in ("position_bias=None", "max_distance=128", "num_landmarks=64", "conv_kernel=None",
                  "bits/byte (lower is better)", "quality-references", "sliding_window:", "auto:"):
        assert whole in result.output, whole
    heads = {line.split(":")[0] for line in lines if line and not line[0].isspace()}
    assert {"causal", "dilated", "nystrom", "sliding_window"} <= heads  # a variant per paragraph


# `attn-bench list` says what `auto` picks as a function of N.
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


# Bad input anywhere the CLI takes it is one line `error: ...` naming the argument, exit code 2, no
# traceback; `attn-bench --debug ...` shows the traceback instead.
ROOT = Path(__file__).resolve().parents[1]


PLUGIN = "attn_bench_broken_plugin"


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


# What a user sees: a run's files are readable by others, the progress bar shows its total, a sweep
# ends by saying where its results are, `check` prints a line per check as it goes.
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_progress_bar_shows_its_total(sweep_out) -> None:
    _, output = sweep_out
    assert "2/2" in output and "/?" not in output, output


def test_a_runs_files_are_readable_by_others(sweep_out) -> None:
    out, _ = sweep_out
    for name in ("results.csv", "env.json", "sweep.json"):
        assert _mode(out / name) == 0o644, name


def test_check_prints_a_line_per_check_as_it_goes() -> None:
    from attn.conformance import check_attention

    seen: list[str] = []
    started: list[str] = []
    report = check_attention("full", kernels=["reference"], quick=True,
                             on_result=lambda r: seen.append(str(r)),
                             on_start=lambda check, kernel, params: started.append(check))
    assert seen == [str(r) for r in report.results] and len(seen) > 3
    assert started == ["construct"] + [r.check for r in report.results]  # each before its result
    result = CliRunner().invoke(app, ["check", "full", "--kernel", "reference"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("quick profile: the first example parameter set"), lines[0]
    assert sum(line.startswith("[PASS]") for line in lines) > 3, result.output
    # a line as each check starts, then its result with its time
    at = lines.index("[ .. ] pattern kernel=reference params={}")
    assert re.fullmatch(r"\[PASS\] pattern kernel=reference params=\{\} \(\d+\.\d s\)", lines[at + 1])
    assert "alibi" not in result.output  # the quick profile: the first parameter set only


def test_check_full_runs_every_parameter_set() -> None:
    result = CliRunner().invoke(app, ["check", "full", "--kernel", "reference", "--full"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("full kit: every example parameter set and shape"), lines[0]
    assert "[PASS] matches_reference kernel=reference params={'position_bias': 'alibi'}" in result.output
    assert lines[-1].startswith("conformance of 'full'")
    assert lines[-1].startswith("conformance of 'full'")


def test_a_sweep_ends_by_saying_where_its_results_are_on_lines_never_wrapped(tmp_path: Path) -> None:
    """Not a terminal (a pipe, CI's log): a long path stays on one line, and the last line
    names the report, the figures and the rows, which exist."""
    from bench.engine.testing import unregister_test_variants

    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
        "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
        "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}]}))
    out = tmp_path / ("a-run-directory-whose-name-is-longer-than-a-terminal-line-" * 2)
    try:
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out)])
    finally:
        unregister_test_variants()
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith(f"{out}: ok 2 rows this run") for line in lines), result.output
    last = lines[-1]
    for name in ("report.md", "report.html", "scaling.png", "results.csv"):
        assert str(out / name) in last, last
        assert (out / name).is_file()
    assert last.startswith(f"results: read {out / 'report.md'} first")
