"""attn-bench approx-error and decoding-step: what they write, and the errors they refuse with."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import attn.registry as registry
from attn import register_attention
from bench.approx.error import SizeSweep, parse_sweep
from bench.cli import app

runner = CliRunner()
LINEAR_SRC = Path(__file__).resolve().parents[1] / "examples" / "attn_bench_linear" / "src"


@pytest.fixture
def linear_attention(monkeypatch):
    """The linear attention plug-in, imported from its folder and registered for one test."""
    monkeypatch.syspath_prepend(str(LINEAR_SRC))
    from attn_bench_linear import LinearAttention

    register_attention("linear_attention", overwrite=True)(LinearAttention)
    yield
    registry.unregister_attention("linear_attention")
    sys.modules.pop("attn_bench_linear", None)


def test_approx_error_writes_the_table_and_nystrom_is_exact_below_its_landmarks(tmp_path, linear_attention):
    out = tmp_path / "approx"
    result = runner.invoke(app, ["approx-error", "--out", str(out), "--length", "16", "--length", "48",
                                 "--variant", "nystrom:num_landmarks=4,48", "--variant", "linear_attention",
                                 "--head-dim", "8"])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "errors.csv")
    assert {(r.variant, r.seq_len) for r in df.itertuples()} >= {("uniform (mean of v)", 16), ("linear_attention", 48)}
    nys = df[df.variant == "nystrom"].set_index(["size", "seq_len"])
    assert nys.loc[(48, 16), "rel_fro"] < 1e-6 and nys.loc[(48, 48), "rel_fro"] < 1e-6  # N <= m: exact
    assert nys.loc[(4, 48), "rel_fro"] > 1e-3  # 4 landmarks for 48 tokens: an approximation
    report = (out / "report.md").read_text()
    assert "| nystrom (num_landmarks=4) |" in report and "| N=16 | N=48 |" in report
    assert (out / "errors.png").stat().st_size > 0 and (out / "env.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--variant", "nystrom:num_landmarks="], "--variant: expected NAME or NAME:PARAM=V1,V2,..."),
    (["--variant", "full"], "--variant: 'full' is not a registered approximate attention"),
    (["--variant", "nystrom:landmarks=4"], "--variant nystrom: unknown parameter 'landmarks'"),
])
def test_approx_error_refuses_bad_variants_in_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["approx-error", "--out", str(tmp_path / "x"), "--length", "8", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_parse_sweep():
    assert parse_sweep("performer:num_features=16,64") == SizeSweep("performer", "num_features", (16, 64))
    assert parse_sweep("linear_attention") == SizeSweep("linear_attention")


def test_decoding_step_reports_time_per_token_with_its_spread(tmp_path, linear_attention):
    out = tmp_path / "step"
    result = runner.invoke(app, ["decoding-step", "--out", str(out), "--attention", "linear_attention",
                                 "--context", "8", "--context", "24", "--steps", "2", "--repeats", "2",
                                 "--num-layers", "1"])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "steps.csv")
    assert list(df.context) == [8, 24] and (df.ms_min <= df.ms_per_token).all()
    assert (df.ms_per_token <= df.ms_max).all() and df.ratio_to_shortest.iloc[0] == 1.0
    assert all(len(t.split()) == 2 for t in df.times_ms)  # one time per repeat
    assert "| linear_attention | 24 |" in (out / "summary.md").read_text()


def test_decoding_step_refuses_a_variant_without_causal_form(tmp_path):
    result = runner.invoke(app, ["decoding-step", "--out", str(tmp_path / "x"), "--attention", "nystrom"])
    assert result.exit_code == 2 and "'nystrom' has no causal form" in result.output, result.output
