"""The library the CLI runs once: ``load_run`` reads and validates a config once (plug-ins
imported by the run, never by the parser), ``dry_run`` lists what a run would do, and a sweep and a grid
take one path."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import yaml
from typer.testing import CliRunner

import bench.runner
from bench.cli import app
from bench.engine.config import ConfigError
from bench.quality.grid_config import GridConfig, parse_grid
from bench.runner import dry_run, load_run, run_plan
from bench.speed.config import SweepConfig, parse_config

SWEEP = {"name": "s", "seq_len": [16, 32], "passes": ["fwd"], "heads": 1, "head_dim": 8,
         "variants": [{"name": "full", "kernels": ["reference"]}]}
GRID = {"name": "g", "kind": "quality", "preset": "tiny", "tasks": ["recall", "bytelm"],
        "variants": ["full", "sliding_window"], "seeds": [0]}
MODULE = "attn_bench_counted_plugin"


@pytest.fixture
def counted_plugin(tmp_path, monkeypatch):
    """A plug-in module that registers a variant and counts its imports in a file."""
    count = tmp_path / "imports"
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(f'''
        import pathlib
        from attn import register_attention
        from attn.variants.sliding_window import SlidingWindowAttention

        path = pathlib.Path({str(count)!r})
        path.write_text(str(int(path.read_text() or 0) + 1) if path.exists() else "1")
        register_attention("counted_window", overwrite=True)(
            type("CountedWindow", (SlidingWindowAttention,), {{}}))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield count
    from attn.registry import unregister_attention

    unregister_attention("counted_window")
    sys.modules.pop(MODULE, None)


def test_parsing_imports_no_plugin(counted_plugin):
    raw = {**SWEEP, "plugins": [MODULE], "variants": [{"name": "counted_window"}]}
    with pytest.raises(ConfigError, match="unknown variant 'counted_window'"):
        parse_config(raw)  # pure: the variant a plug-in would register is not there
    with pytest.raises(ConfigError, match="must name a registered variant"):
        parse_grid({**GRID, "plugins": [MODULE], "variants": ["counted_window"]})
    assert MODULE not in sys.modules and not counted_plugin.exists()
    config = load_run(raw)  # the run imports them, then parses
    assert isinstance(config, SweepConfig) and config.variants[0].name == "counted_window"
    assert counted_plugin.read_text() == "1"


def test_a_config_is_read_and_parsed_once(tmp_path, monkeypatch):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    calls = {"read": 0, "parse": 0}
    read, parse = bench.runner.read_config, bench.runner.parse_config

    def counted_read(*args):
        calls["read"] += 1
        return read(*args)

    def counted_parse(*args, **kwargs):
        calls["parse"] += 1
        return parse(*args, **kwargs)

    monkeypatch.setattr(bench.runner, "read_config", counted_read)
    monkeypatch.setattr(bench.runner, "parse_config", counted_parse)
    config = load_run(path, {"seq_len": [64], "repeats": 2, "variants": None})
    assert calls == {"read": 1, "parse": 1}
    assert config.seq_len == (64,) and config.repeats == 2 and config.variants[0].name == "full"


def test_overrides_a_kind_does_not_take_name_the_key():
    with pytest.raises(ConfigError, match="config key 'kernels': a speed-sweep setting") as err:
        load_run(GRID, {"kernels": ["sdpa"]})
    assert err.value.key == "kernels"
    with pytest.raises(ConfigError, match="config key 'tasks': only a training grid"):
        load_run(SWEEP, {"tasks": ["recall"]})
    grid = load_run(GRID, {"variants": ["full"], "tasks": ["recall"], "threads": 1})
    assert isinstance(grid, GridConfig)
    assert grid.only == ("full",) and grid.tasks == ("recall",) and grid.threads == 1


def test_the_dry_run_of_a_sweep_marks_the_cases_already_measured(tmp_path):
    from bench.engine.results import ResultsWriter

    config = load_run(SWEEP)
    cases = run_plan(config).cases
    found = dry_run(config, tmp_path)
    assert [p.state for p in found.items] == ["todo", "todo"]
    ResultsWriter(tmp_path, [{"case_id": cases[0].case_id, "label": "full", "variant": "full",
                              "kernel_requested": "reference", "seq_len": 16, "pass": "fwd",
                              "status": "ok", "time_ms": 1.0,
                              "timestamp": "2026-01-01T00:00:00"}])
    found = dry_run(config, tmp_path)
    assert [p.state for p in found.items] == ["done", "todo"]
    assert found.lines()[-1] == f"2 cases, 1 already done in {tmp_path}"
    assert found.lines()[0].startswith(f"   1 {cases[0].case_id} done full [reference] N=16")


def test_the_dry_run_of_a_grid_marks_done_and_changed_units(tmp_path):
    from bench.engine.results import ResultsWriter
    from bench.engine.row_schema import QUALITY_COLUMNS
    from bench.quality.grid import QUALITY_FILE
    from bench.quality.settings import task_settings

    config = load_run({**GRID, "tasks": ["recall"]})
    units = run_plan(config).dry_run_items([], tmp_path)
    assert [u.state for u in units] == ["todo", "todo"]
    settings = task_settings("recall", "tiny")
    changed = json.loads(settings.to_json())
    changed["train"]["steps"] = 999
    rows = [{"unit_id": units[0].key, "task": "recall", "variant": "full", "params": "{}",
             "settings": settings.to_json(), "split": "test", "metric": "accuracy",
             "condition": "", "value": 0.5, "status": "ok", "seed": 0, "preset": "tiny",
             "timestamp": "2026-01-01T00:00:00+00:00"},
            {"unit_id": units[1].key, "task": "recall", "variant": "sliding_window",
             "params": json.dumps({"window": 4}), "settings": json.dumps(changed),
             "split": "test", "metric": "accuracy", "condition": "", "value": 0.5,
             "status": "ok", "seed": 0, "preset": "tiny",
             "timestamp": "2026-01-01T00:00:00+00:00"}]
    ResultsWriter(tmp_path, rows, QUALITY_FILE, QUALITY_COLUMNS)
    found = dry_run(config, tmp_path)
    assert [p.state for p in found.items] == ["done", "todo (settings changed)"]
    assert found.lines()[-1] == f"2 training runs, 1 already done in {tmp_path}"


def test_the_cli_dry_run_of_a_grid_prints_its_items(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o"),
                                      "--dry-run", "--task", "recall"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"2 training runs, 0 already done in {tmp_path / 'o'}"
    refused = CliRunner().invoke(app, ["sweep", str(path), "--dry-run", "--kernel", "sdpa"])
    assert refused.exit_code == 2 and "--kernel: a speed-sweep setting" in refused.output
    wrong = CliRunner().invoke(app, ["sweep", "quick", "--dry-run", "--task", "recall"])
    assert wrong.exit_code == 2 and "--task: only a training grid" in wrong.output


def test_a_grid_runs_in_pieces_by_seed_and_refuses_a_seed_it_does_not_have(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, "seeds": {"default": [0, 1, 2], "bytelm": [0, 1]}}))
    config = load_run(str(path), {"seeds": [2, 1]})
    assert dict(config.seeds) == {"recall": (1, 2), "bytelm": (1,)}
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o"),
                                      "--dry-run", "--seed", "2", "--task", "recall"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"2 training runs, 0 already done in {tmp_path / 'o'}"
    unknown = CliRunner().invoke(app, ["sweep", str(path), "--dry-run", "--seed", "3"])
    assert unknown.exit_code == 2
    assert "--seed: unknown value 3; allowed values are the grid's seeds [0, 1, 2]" in unknown.output
    speed = CliRunner().invoke(app, ["sweep", "quick", "--dry-run", "--seed", "0"])
    assert speed.exit_code == 2 and "--seed: only a training grid" in speed.output


def test_the_run_plan_of_a_grid_says_its_computed_references_apart_from_its_training_runs(tmp_path):
    from bench.runner import size_of

    config = load_run({**GRID, "references": ["naive_bayes_tokens", "ngram_2"]})
    said = "4 training runs and 2 computed references"  # recall and bytelm, one reference each
    assert dry_run(config, tmp_path).lines()[-1] == f"{said}, 0 already done in {tmp_path}"
    assert size_of(run_plan(config)) == f"{said} in the grid"
    alone = load_run({**GRID, "variants": [], "references": ["naive_bayes_tokens", "ngram_2"]})
    assert size_of(run_plan(alone)) == "0 training runs and 2 computed references in the grid"
    one = load_run({**GRID, "tasks": ["recall"], "variants": ["full"],
                    "references": ["naive_bayes_tokens"]})
    assert size_of(run_plan(one)) == "1 training run and 1 computed reference in the grid"
    assert size_of(run_plan(load_run(GRID))) == "4 training runs in the grid"
    assert size_of(run_plan(load_run({**SWEEP, "seq_len": [16]}))) == "1 case in the config"
