"""Training grids run through the same executors, isolation, resume and failure rows as speed
sweeps; the report gives the quality table and the plots the three figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.engine.config import ConfigError
from bench.quality.grid import QUALITY_FILE, run_grid
from bench.quality.grid_config import parse_grid
from bench.quality.report import build_quality_report, load_quality
from bench.quality.units import units

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
    ({"variants": [{"name": "full", "model": {"positon": "none"}}]},
     "'variants[0].model.positon': not a model setting of task 'recall'"),
    ({"variants": [{"name": "full", "model": {"position": "nowhere"}}]},
     "'variants[0].model.position': position: unknown value 'nowhere'"),
    ({"variants": [{"name": "relative", "model": {"position": "learned"}}]},
     "'variants[0].model.position': position: must be 'none'"),
    ({"variants": [{"name": "full", "model": "none"}]}, "'variants[0].model': must be a mapping"),
    ({"variants": [{"name": "full", "train": {"lrate": 0.001}}]},
     "'variants[0].train': train.lrate: unknown setting"),
    ({"variants": [{"name": "full", "train": {"budget_x": 2}}]},
     "'variants[0].train.budget_x': set by the grid's 'budgets' key"),
    ({"variants": [{"name": "full", "train": {}}]}, "'variants[0].train': must be a non-empty mapping"),
    ({"variants": [{"name": "full", "role": "baseline"}]},
     "'variants[0].role': unknown value 'baseline'; allowed values are ['control', 'reference', 'variant']"),
    ({"references": ["bigram"]}, "'references': unknown reference 'bigram'; allowed values are 'all'"),
    ({"references": "some"}, "'references': must be 'all' or a list of reference names"),
    ({"variants": [{"name": "full"}, "full"]}, "'variants[1]': the same training run as variants[0]"),
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


@pytest.mark.slow  # an end-to-end run: in the full suite
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


@pytest.mark.slow  # an end-to-end run: in the full suite
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


@pytest.mark.slow  # an end-to-end run: in the full suite
def test_the_report_and_the_figures(grid_run):
    out, _ = grid_run
    text = build_quality_report(out)
    assert "| variant | bytelm | recall | avg (accuracy tasks) |" in text  # the suite's task order
    assert "unsupported" in text and "| majority class" in text and "| uniform chance" in text
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

    row = pd.Series({"variant": "dilated", "params": '{"window": 16}', "settings": json.dumps(
        {"model": {"num_layers": 2, "num_heads": 4, "d_model": 64},
         "data": {"seq_len": 256, "distances": [8, 64], "pair_gap": 2}})})
    # the default dilation 2: the pair meets on the odd positions, 2 x (2 x 16 - 1) back
    # (dilation 1 would give 2 x 16 - 2 = 30; bench/quality/reach.py)
    assert _reach(row) == 62


@pytest.mark.slow  # 15 s; a killed unit's rows (failure_rows) and a killed speed worker's stay in the default run
def test_a_grid_through_the_cli_with_a_killed_unit(tmp_path):
    """A training worker that dies becomes a row; the other units still run."""
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump({
        **GRID, "tasks": ["recall"], "seeds": [0], "timeout_s": 120,
        "variants": [{"name": "bench_crash", "how": "kill"}, {"name": "full"}]}))
    result = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", str(config), "--out",
                             str(tmp_path / "out"), "--plugin", "bench.engine.testing"], cwd=ROOT,
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
    from bench.quality.tasks import get_task, list_tasks, task_info

    for task_name in list_tasks():
        if preset not in task_info(task_name).presets:
            continue  # a task without this preset (video has no lra)
        settings = task_settings(task_name, preset)
        if task_name in ("image", "image_vit", "translate"):
            continue  # their length comes from the data (image size, BPE), checked on real data
        task = get_task(task_name, settings.data, seed=0)
        side = settings.data.get("size", 0) // settings.data.get("patch", 1)  # pathfinder: tokens per row
        length = int(settings.data.get("seq_len", settings.data.get("src_len", side**2)))
        if task_name == "video":  # token frames x positions, from the clip settings
            length = task.seq_len
        assert length >= 4 * settings.attention["window"], (task_name, length)
        assert task.name == task_name


# labels, control rows with model overrides, rows of units the config no longer lists

def _alternative(value):
    """Another value of a parameter's kind (the label must change with it)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return "alibi" if value != "alibi" else "learned"
    return 3  # a None default: any value set


def test_configurations_that_differ_in_any_pattern_parameter_never_share_a_label():
    from attn import attention_info, list_attention
    from bench.quality.model_parts import label
    from bench.speed.config import VariantSpec

    checked = 0
    for name in list_attention():
        defaults = attention_info(name).params
        for key, default in defaults.items():
            base = {"position_bias": "learned"} if key == "max_distance" and "position_bias" in defaults else {}
            if key == "max_distance" and "bias" in defaults:
                base = {"bias": "learned"}  # relative: max_distance clips the learned bias
            if key == "position_bias" and "bias" in defaults:
                continue  # relative takes its bias through 'bias'
            one, other = {**base, key: default}, {**base, key: _alternative(default)}
            assert label(name, one) != label(name, other), (name, key)
            # the speed sweeps' label is the same function
            assert VariantSpec(name, tuple(other.items())).label == label(name, other)
            checked += 1
    assert checked >= 15
    # defaults are named: nothing a default hides, nothing that does not define the pattern
    assert label("relative", {}) == "relative(bias=learned, max_distance=128)"
    assert label("relative", {"bias": "alibi", "max_distance": 64}) == "relative(bias=alibi)"
    assert label("dilated", {"window": 16}) == "dilated(dilation=2, window=16)"
    assert label("dilated", {"dilation": [1, 2]}) == "dilated(dilation=(1, 2), window=64)"
    assert label("full", {"num_heads": 4, "kernel": "sdpa"}) == "full"
    assert label("full", {"position_bias": "alibi"}) == "full(position_bias=alibi)"
    assert label("full", {}, {"model": {"position": "none"}}) == "full [position=none]"


CONTROL = {"name": "full", "model": {"position": "none"}, "role": "control",
           "title": "order-blind"}


def _plain_unit_id(spec):
    """The unit id of grids before overrides (units without overrides must keep it)."""
    import hashlib

    key = {k: spec[k] for k in ("task", "variant", "params", "preset", "seed", "kernel", "device")}
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def test_a_control_entry_carries_its_model_override_into_the_run(tmp_path):
    from bench.engine.config import safe_name

    config = parse_grid({**GRID, "tasks": ["recall"], "seeds": [0],
                         "variants": ["full", CONTROL, {"name": "dilated", "window": 64}]})
    plain, control, dilated = units(config, tmp_path)
    assert plain.spec["overrides"] == {} and plain.unit_id == _plain_unit_id(plain.spec)
    assert control.spec["overrides"] == {"model": {"position": "none"}}
    assert control.unit_id != plain.unit_id and control.spec["out"] != plain.spec["out"]
    assert control.label == "full [position=none]" and control.role == "control"
    assert Path(control.spec["out"]).parent.name == safe_name(control.label) == "full_position_none"
    assert dilated.label == "dilated(dilation=2, window=64)"
    rows = control.failure_rows("killed", "SIGKILL")
    assert rows[0]["role"] == "control" and rows[0]["title"] == "order-blind"
    assert json.loads(rows[0]["overrides"]) == {"model": {"position": "none"}}
    from bench.quality.train import RunSpec, build

    settings, _, _, _ = build(RunSpec(**control.spec))  # what the worker trains with
    assert settings.model["position"] == "none"


def test_a_wider_entry_trains_with_its_own_recipe_and_is_a_run_of_its_own(tmp_path):
    from bench.quality.train import RunSpec, build

    wide = {"name": "full", "model": {"d_model": 32, "d_ff": 64}, "train": {"lr": 0.0005, "steps": 6}}
    config = parse_grid({**GRID, "tasks": ["recall"], "seeds": [0],
                         "variants": ["full", {"name": "full", "model": {"d_model": 32, "d_ff": 64}}, wide]})
    plain, wider, recipe = units(config, tmp_path)
    assert recipe.spec["overrides"] == {"model": {"d_model": 32, "d_ff": 64},
                                        "train": {"lr": 0.0005, "steps": 6}}
    assert len({plain.unit_id, wider.unit_id, recipe.unit_id}) == 3  # the recipe makes a run of its own
    assert recipe.label == "full [d_ff=64, d_model=32, train.lr=0.0005, train.steps=6]"
    settings, _, _, _ = build(RunSpec(**recipe.spec))  # what the worker trains with
    assert (settings.model["d_model"], settings.train.lr, settings.train.steps) == (32, 0.0005, 6)
    assert settings.train.batch_size == build(RunSpec(**plain.spec))[0].train.batch_size  # the rest: the preset's


def test_an_override_unit_compares_its_rows_with_the_settings_its_overrides_give():
    from bench.quality.grid import superseded_units
    from bench.quality.settings import task_settings

    config = parse_grid({**GRID, "tasks": ["recall"], "seeds": [0], "variants": ["full", CONTROL]})
    overrides = json.dumps({"model": {"position": "none"}})
    with_override = task_settings("recall", "tiny", {"model": {"position": "none"}}).to_json()
    preset_alone = task_settings("recall", "tiny").to_json()
    rows = [{"unit_id": "a", "task": "recall", "settings": with_override, "overrides": overrides},
            {"unit_id": "b", "task": "recall", "settings": preset_alone, "overrides": ""},
            {"unit_id": "c", "task": "recall", "settings": preset_alone, "overrides": overrides}]
    assert superseded_units(rows, config) == {"c"}


def test_an_entry_restricted_to_some_tasks_trains_and_keeps_rows_only_there(tmp_path):
    from bench.quality.grid import foreign_units

    restricted = {**CONTROL, "tasks": ["recall"]}
    config = parse_grid({**GRID, "seeds": [0], "variants": ["full", restricted]})
    found = [(u.spec["task"], u.label) for u in units(config, tmp_path)]
    assert found == [("recall", "full"), ("recall", "full [position=none]"), ("bytelm", "full")]
    rows = _done_rows(config, tmp_path)
    assert foreign_units(rows, config) == set()  # the restricted entry's rows are wanted
    everywhere = parse_grid({**GRID, "seeds": [0], "variants": ["full", CONTROL]})
    bytelm_control = [u for u in units(everywhere, tmp_path) if u.spec["task"] == "bytelm"
                      and u.role == "control"]
    assert foreign_units(_done_rows(config, tmp_path, bytelm_control), config) == {
        bytelm_control[0].unit_id}
    for bad in (["listops"], [], "recall"):
        with pytest.raises(ConfigError, match=r"variants\[1\]\.tasks': must be a non-empty list "
                                              r"of the grid's tasks"):
            parse_grid({**GRID, "variants": ["full", {**CONTROL, "tasks": bad}]})


def _done_rows(config, out, extra=()):
    """Finished rows for every unit of ``config`` (as if trained), plus ``extra`` units."""
    from bench.quality.settings import task_settings

    rows = []
    for unit in [*units(config, out), *extra]:
        s = unit.spec
        rows.append({"unit_id": unit.unit_id, "task": s["task"], "variant": s["variant"],
                     "label": unit.label, "params": json.dumps(unit.attention_params),
                     "seed": s["seed"], "preset": s["preset"], "split": "test",
                     "metric": "accuracy", "condition": "", "value": 0.5, "status": "ok",
                     "settings": task_settings(s["task"], s["preset"], s["overrides"]).to_json(),
                     "overrides": json.dumps(s["overrides"]) if s["overrides"] else "",
                     "role": unit.role, "timestamp": "2026-01-01T00:00:00+00:00"})
    return rows


def test_rows_of_entries_the_config_no_longer_lists_move_to_superseded(tmp_path):
    import pandas as pd

    from bench.engine.results import ResultsWriter
    from bench.engine.row_schema import QUALITY_COLUMNS
    from bench.quality.grid import SUPERSEDED_FILE, foreign_units

    base = {**GRID, "tasks": ["recall"], "seeds": [0]}
    before = parse_grid({**base, "variants": ["full", "sliding_window",
                                              {**CONTROL, "model": {"position": "learned"}}]})
    now = parse_grid({**base, "variants": ["full", CONTROL]})
    rows = _done_rows(now, tmp_path, extra=units(before, tmp_path)[1:])
    gone = {u.unit_id for u in units(before, tmp_path)[1:]}
    assert foreign_units(rows, now) == gone
    learned = units(before, tmp_path)[2].unit_id  # full [position=learned]
    # --variant full: only full's entries are judged (same name, other overrides: moved)
    assert foreign_units(rows, parse_grid({**base, "variants": ["full", CONTROL]},
                                          only=["full"])) == {learned}
    # a command line's --variant leaves the other variants' rows alone
    assert foreign_units(rows, parse_grid({**base, "variants": ["sliding_window", "full"]},
                                          only=["sliding_window"])) == set()
    old_columns = QUALITY_COLUMNS[:QUALITY_COLUMNS.index("role")]
    ResultsWriter(tmp_path, [{"unit_id": "older", "task": "recall", "status": "ok",
                              "timestamp": "2026-01-01T00:00:00+00:00"}],
                  SUPERSEDED_FILE, old_columns)  # an archive from before the new columns
    ResultsWriter(tmp_path, rows, QUALITY_FILE, QUALITY_COLUMNS)
    assert run_grid(now, tmp_path) == []  # everything the config lists is done
    kept = pd.read_csv(tmp_path / QUALITY_FILE, dtype=str, keep_default_na=False)
    assert set(kept.unit_id) == {u.unit_id for u in units(now, tmp_path)}
    archived = pd.read_csv(tmp_path / SUPERSEDED_FILE, dtype=str, keep_default_na=False)
    assert set(archived.unit_id) == gone | {"older"}
    assert set(archived[archived.unit_id.isin(gone)].variant) == {"sliding_window", "full"}


def test_a_new_train_setting_supersedes_only_the_units_it_can_change():
    # Rows recorded before `position_bias_lr_scale` (and `budget_x`) existed: the multiplier
    # moves only bias tables, so full attention's row stays done and relative's trains again.
    from bench.quality.grid import superseded_units
    from bench.quality.settings import task_settings

    config = parse_grid({**GRID, "tasks": ["recall"], "seeds": [0],
                         "variants": ["full", {"name": "relative", "bias": "learned"}]})
    old = json.loads(task_settings("recall", "tiny").to_json())
    for key in ("position_bias_lr_scale", "budget_x"):
        del old["train"][key]
    old_json = json.dumps(old, sort_keys=True)
    rows = [{"unit_id": "full", "task": "recall", "variant": "full", "params": "{}",
             "settings": old_json, "overrides": ""},
            {"unit_id": "relative", "task": "recall", "variant": "relative",
             "params": json.dumps({"bias": "learned"}), "settings": old_json, "overrides": ""},
            {"unit_id": "sw+bias", "task": "recall", "variant": "sliding_window",
             "params": json.dumps({"position_bias": "alibi"}), "settings": old_json,
             "overrides": ""}]
    assert superseded_units(rows, config) == {"relative", "sw+bias"}
    changed = json.loads(old_json)
    changed["train"]["lr"] = 0.5  # a setting every unit feels
    rows[0]["settings"] = json.dumps(changed, sort_keys=True)
    assert "full" in superseded_units(rows, config)


def test_a_grid_run_in_pieces_by_task_leaves_the_other_tasks_rows_alone(tmp_path):
    from bench.quality.grid import foreign_units, superseded_units
    from bench.quality.grid_config import only_tasks

    now = parse_grid({**GRID, "seeds": [0], "variants": ["full", CONTROL]})
    before = parse_grid({**GRID, "seeds": [0], "variants": ["full", "sliding_window"]})
    rows = _done_rows(before, tmp_path)  # sliding_window rows on both tasks: foreign now
    stale_bytelm = [dict(r, unit_id="stale", settings="{}") for r in rows
                    if r["task"] == "bytelm"][:1]
    rows += stale_bytelm
    piece = only_tasks(now, ["recall"])
    assert piece.tasks == ("recall",)
    assert {u.spec["task"] for u in units(piece, tmp_path)} == {"recall"}
    judged = {r["unit_id"]: r["task"] for r in rows}
    assert {judged[u] for u in foreign_units(rows, piece)} == {"recall"}
    assert superseded_units(rows, piece) == set()  # the stale bytelm row is not this piece's
    assert superseded_units(rows, now) == {"stale"}
    with pytest.raises(ConfigError, match=r"--task: unknown value 'listops'; allowed values are "
                                          r"the grid's tasks \['recall', 'bytelm'\]"):
        only_tasks(now, ["listops"])
