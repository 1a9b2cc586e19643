"""``attn-bench reproduce`` re-measures a run's interleaved ratios and says which hold: a run of
two sleeping variants of known times reproduces; a committed ratio far from the one measured
here fails, and exits 1 when it is a headline figure."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.testing import unregister_test_variants
from bench.speed.reproduce import compare_ratios, failed_headlines, sampled_lengths

runner = CliRunner()


def _rows(ratio: float, spread: float, lengths=(64, 128)) -> pd.DataFrame:
    """Two kernels timed together at each length: the slow one ``ratio`` times the fast one."""
    rows = []
    for n in lengths:
        for kernel, scale in (("sdpa", 1.0), ("reference", ratio)):
            times = [10 * scale * (1 + spread * ((i % 3) - 1)) if kernel == "reference" else 10.0 for i in range(5)]
            rows.append({"label": "full", "kernel_requested": kernel, "seq_len": n, "pass": "fwd",
                         "status": "ok", "interleaved": 2, "interleave_id": f"u{n}", "kv_heads": 4,
                         "time_ms": sorted(times)[2], "times_ms": json.dumps(times), "peak_mem_bytes": 1.0})
    return pd.DataFrame(rows)


def test_a_ratio_holds_within_its_spread_and_fails_beyond():
    committed = _rows(2.0, 0.05)
    assert compare_ratios(committed, _rows(2.08, 0.02)).holds.all()  # within 10%
    table = compare_ratios(committed, _rows(3.0, 0.02, lengths=(128,)))
    assert len(table) == 1 and not table.holds.any()  # only the length measured here is read
    assert len(failed_headlines(table)) == 1  # the reference row at the longest length
    assert compare_ratios(committed, _rows(3.0, 0.02, lengths=(64,))).headline.sum() == 0
    assert sampled_lengths(_rows(2.0, 0.0, lengths=(64, 128, 256, 512, 1024)), 2) == (64, 1024)
    noisy_here = _rows(3.0, 0.02).assign(noisy=[False, False, False, True])  # the 128 row under contention
    judged = compare_ratios(committed, noisy_here)
    assert judged.holds.tolist()[0] is False and pd.isna(judged.holds.tolist()[1])  # never judged
    grouped = committed.assign(kernel_requested="sdpa", heads=4,
                               kv_heads=[4, 2] * 2)  # one kernel, its rows told apart by key heads
    assert len(compare_ratios(grouped, grouped)) == 2 and compare_ratios(grouped, grouped).holds.all()
    one_kernel_units = committed.assign(interleaved=1)  # rows of one length timed one after another
    assert compare_ratios(one_kernel_units, _rows(2.08, 0.02).assign(interleaved=1)).holds.all()


@pytest.mark.slow  # an end-to-end run: in the full suite
@pytest.mark.serial  # times known sleeps in interleaved rounds
def test_a_run_of_known_ratios_reproduces(tmp_path):
    config = {"name": "twin-sleeps", "plugins": ["bench.engine.testing"], "seq_len": [32, 64],
              "passes": ["fwd"], "heads": [1], "head_dim": [8], "repeats": 5, "min_repeats": 5,
              "time_budget_s": 0.1, "interleave": "variants", "peak_matmul_size": 64,
              # sleeps of known length: the ratios are the subject here, not the noise policy
              "noise_threshold": 100.0,
              "variants": [{"name": "bench_sleep", "seconds": 0.01}, {"name": "bench_sleep", "seconds": 0.03}]}
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        made = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "committed")])
        assert made.exit_code == 0, made.output
        again = runner.invoke(app, ["reproduce", str(tmp_path / "committed"), "--sample", "1",
                                    "--out", str(tmp_path / "here")])
    finally:
        unregister_test_variants()
    assert again.exit_code == 0, again.output
    report = (tmp_path / "here" / "reproduce.md").read_text()
    assert "(N = 64)" in report and "| yes |" in report and "**no**" not in report
