"""A case's identity includes everything that changes its measurement: a rerun into the same
run directory with another thread count is refused with one line naming the setting (old
and new value), even when every case id is already done, never answered with the old rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.results import RESULTS_FILE
from bench.runner import load_run
from bench.speed.sweep import MixedEnvironmentError, run_sweep


def _config(**extra) -> dict:
    return {"name": "settings", "passes": ["fwd"], "seq_len": [16], "heads": 1, "head_dim": 8,
            "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
            "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}],
            **extra}


@pytest.fixture(autouse=True)
def _unregister():
    from bench.engine.testing import unregister_test_variants

    yield
    unregister_test_variants()


def test_a_rerun_with_another_thread_count_is_refused_not_reused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_sweep(load_run(_config(threads=1)), out)
    before = (out / RESULTS_FILE).read_text()
    assert run_sweep(load_run(_config(threads=1)), out) == []  # same setting: nothing new
    with pytest.raises(MixedEnvironmentError, match=r"threads 1 -> 2"):
        run_sweep(load_run(_config(threads=2)), out)
    assert (out / RESULTS_FILE).read_text() == before


def test_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(_config(threads=1)))
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert first.exit_code == 0, first.output
    config.write_text(yaml.safe_dump(_config(threads=2)))
    again = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert again.exit_code == 2, again.output
    line, = again.output.strip().splitlines()
    assert "threads 1 -> 2" in line


def test_the_dry_run_says_what_the_run_does(tmp_path: Path) -> None:
    """A dry run with another thread count is refused with the run's line, not listed as
    done; with --allow-mixed both keep the rows; the same setting lists every case done."""
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(_config(threads=1)))
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out)]
    assert CliRunner().invoke(app, [*args, "--no-plots"]).exit_code == 0
    same = CliRunner().invoke(app, [*args, "--dry-run"])
    assert same.exit_code == 0 and "1 case, 1 already done" in same.output, same.output
    config.write_text(yaml.safe_dump(_config(threads=2)))
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    real = CliRunner().invoke(app, [*args, "--no-plots"])
    assert dry.exit_code == real.exit_code == 2, (dry.output, real.output)
    assert dry.output == real.output and "threads 1 -> 2" in dry.output
    mixed = CliRunner().invoke(app, [*args, "--dry-run", "--allow-mixed"])
    assert mixed.exit_code == 0 and "1 case, 1 already done" in mixed.output, mixed.output
