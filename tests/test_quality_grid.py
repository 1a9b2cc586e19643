"""Training grids run through the same executors, isolation, resume and failure rows as speed
sweeps; the report gives the quality table and the plots the three figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.config import ConfigError
from bench.quality.grid import QUALITY_FILE, parse_grid, run_grid, units
from bench.quality.report import build_quality_report, load_quality

ROOT = Path(__file__).resolve().parents[1]
GRID = {"name": "tiny-grid", "kind": "quality", "preset": "tiny",
        "tasks": ["recall", "bytelm"],
        "variants": [{"name": "full"}, {"name": "sliding_window"}, {"name": "nystrom"}],
        "seeds": {"default": [0], "recall": [0, 1]}, "timeout_s": 300}


@pytest.mark.parametrize(("change", "fragment"), [
    ({"tasks": ["nope"]}, "'tasks': must be a non-empty list of tasks"),
    ({"variants": [{"name": "nope"}]}, "'variants[0]': must name a registered variant"),
    ({"variants": [{"name": "full", "windw": 3}]}, "'variants[0].windw': unknown parameter"),
    ({"seeds": {"textt": [0]}}, "'seeds.textt': not a task of the grid"),
    ({"seeds": [-1]}, "'seeds': must be a non-empty list of integers >= 0"),
    ({"preset": "huge"}, "'preset': unknown preset 'huge'"),
    ({"epochs": 3}, "'epochs': unknown key"),
])
def test_bad_grids_name_the_key(change, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_grid({**GRID, **change})


def test_every_task_gets_its_first_seed_before_any_task_repeats(tmp_path):
    config = parse_grid({**GRID, "tasks": ["listops", "text", "recall"],
                         "variants": ["full"], "seeds": {"default": [0], "text": [4, 5, 6]}})
    order = [(u.spec["task"], u.spec["seed"]) for u in units(config, tmp_path)]
    assert order == [("listops", 0), ("text", 4), ("recall", 0), ("text", 5), ("text", 6)]


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    rows = run_grid(parse_grid(GRID), out)
    return out, rows


def test_every_unit_is_a_set_of_rows(grid_run):
    out, rows = grid_run
    config = parse_grid(GRID)
    assert len(units(config, out)) == 3 * 2 + 3 * 1
    df = load_quality(out)
    assert len(df) == len(rows)
    assert set(df.unit_id) == {u.unit_id for u in units(config, out)}
    nystrom_lm = df[(df.task == "bytelm") & (df.variant == "nystrom")]
    assert list(nystrom_lm.status) == ["unsupported"]
    ok = df[df.status == "ok"]
    assert ok.param_count.notna().all() and (ok.train_tokens_per_s > 0).all()
    assert (out / "grid.json").exists() and (out / "grid.yaml").exists()
    assert run_grid(config, out) == []  # resume: nothing left to do


def test_units_trained_with_other_task_settings_run_again_and_keep_their_old_rows(grid_run, tmp_path):
    import shutil

    import pandas as pd

    from bench.quality.grid import SUPERSEDED_FILE

    out = tmp_path / "grid"
    shutil.copytree(grid_run[0], out)
    config = parse_grid(GRID)
    df = pd.read_csv(out / QUALITY_FILE, dtype=str, keep_default_na=False)
    edited = df[(df.task == "recall") & (df.variant == "full") & (df.seed == "0")].unit_id.iloc[0]
    df.loc[df.unit_id == edited, "settings"] = df.loc[df.unit_id == edited, "settings"].str.replace(
        '"steps": ', '"steps": 999', n=1)  # as if the preset had been edited after this run
    df.to_csv(out / QUALITY_FILE, index=False)
    new_rows = run_grid(config, out)
    assert {r["unit_id"] for r in new_rows} == {edited}  # only that unit trains again
    old = pd.read_csv(out / SUPERSEDED_FILE, dtype=str, keep_default_na=False)
    assert set(old.unit_id) == {edited} and len(old) == (df.unit_id == edited).sum()
    now = load_quality(out)
    assert len(now) == len(df) and set(now.unit_id) == {u.unit_id for u in units(config, out)}
    assert not now.settings.str.contains('"steps": 999').any()


def test_the_report_and_the_figures(grid_run):
    out, _ = grid_run
    text = build_quality_report(out)
    assert "| variant | bytelm | recall | avg (accuracy tasks) |" in text  # the suite's task order
    assert "unsupported" in text and "chance (majority class)" in text
    assert "## Recall accuracy by distance (test)" in text
    assert "## Bits per byte by evaluation length" in text
    full_row = next(line for line in text.splitlines() if line.startswith("| full | "))
    bytelm_cell, recall_cell = full_row.split(" | ")[1:3]
    assert "±" in recall_cell and "±" not in bytelm_cell  # two recall seeds, one bytelm seed
    from bench.quality.plots import plot_quality_run

    names = {p.name for p in plot_quality_run(out)}
    assert {"pareto.png", "recall_distance.png", "bytelm_length.png"} <= names


def test_the_recall_reach_takes_a_variant_default_the_row_does_not_record():
    import pandas as pd

    from bench.quality.plots import _reach

    row = pd.Series({"variant": "dilated", "params": '{"window": 16}',
                     "settings": '{"model": {"num_layers": 2}}'})
    assert _reach(row) == 2 * 16 * 2  # layers x window x the default dilation


def test_a_grid_through_the_cli_with_a_killed_unit(tmp_path):
    """A training worker that dies becomes a row; the other units still run."""
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump({
        **GRID, "tasks": ["recall"], "seeds": [0], "timeout_s": 120,
        "variants": [{"name": "bench_crash", "how": "kill"}, {"name": "full"}]}))
    result = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", str(config), "--out",
                             str(tmp_path / "out"), "--plugin", "bench.testing"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    df = load_quality(tmp_path / "out")
    crashed = df[df.variant == "bench_crash"]
    assert list(crashed.status) == ["killed"] and crashed.reason.str.contains("SIGKILL").all()
    assert (df[df.variant == "full"].status == "ok").all()
    assert (tmp_path / "out" / "report.md").exists() and (tmp_path / "out" / QUALITY_FILE).exists()


@pytest.mark.parametrize("preset", ["tiny", "small", "lra"])
def test_every_task_preset_parses_and_keeps_four_windows(preset):
    from bench.quality.settings import task_settings
    from bench.quality.tasks import get_task, list_tasks

    for task_name in list_tasks():
        settings = task_settings(task_name, preset)
        if task_name in ("image", "image_vit", "translate"):
            continue  # their length comes from the data (image size, BPE), checked on real data
        task = get_task(task_name, settings.data, seed=0)
        side = settings.data.get("size", 0) // settings.data.get("patch", 1)  # pathfinder: tokens per row
        length = int(settings.data.get("seq_len", side**2))
        assert length >= 4 * settings.attention["window"], (task_name, length)
        assert task.name == task_name
