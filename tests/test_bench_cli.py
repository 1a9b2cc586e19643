"""The ``attn-bench`` command line: help everywhere, clear errors, compare exit codes, check."""

from __future__ import annotations

import pytest
from test_bench_scaling import write_run
from typer.testing import CliRunner

from bench.cli import app

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
