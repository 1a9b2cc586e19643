"""Quality at matched compute: the FLOPs of a training step equal a hand count, a budget buys
floor(budget / FLOPs per step) steps with the schedule stretched to them, bad settings name
themselves, a grid's budget axis adds distinct units, and the table and figure read rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from bench.engine.config import ConfigError
from bench.engine.row_schema import BUDGET_COLUMNS, QUALITY_COLUMNS
from bench.quality.budget import (
    budget_of,
    budget_table,
    count_step_flops,
    flop_budget,
    matched_budget,
    plot_budget,
    split_budget,
)
from bench.quality.grid_config import parse_grid
from bench.quality.settings import TrainSettings, task_settings
from bench.quality.units import units
from models import create_model

B, N, D, H, L, FF, C, VOCAB = 3, 24, 16, 2, 2, 40, 5, 11


def _classifier(attention: str, **params) -> torch.nn.Module:
    return create_model("encoder_classifier", "mini", attention=attention, attention_params=params,
                        vocab_size=VOCAB, num_classes=C, d_model=D, num_heads=H, num_layers=L,
                        d_ff=FF, max_len=64, pooling="mean")


def _flops(attention: str, **params):
    model = _classifier(attention, **params)
    ids = torch.randint(0, VOCAB, (B, N), generator=torch.Generator().manual_seed(0))
    return count_step_flops(model, lambda: model(ids))


def test_dense_flops_are_six_times_tokens_times_weights():
    flops = _flops("full")
    per_token = L * (4 * D * D + 2 * D * FF)  # q, k, v, out projections and the FFN, per layer
    forward = 2 * B * N * per_token + 2 * B * D * C  # the head reads one pooled vector per input
    assert flops.dense == 3 * forward  # backward = 2x forward (Kaplan et al. 2020)


def test_full_attention_is_four_b_h_n2_d_forward_and_2_5x_backward():
    flops = _flops("full")
    forward = 4 * B * H * N * N * (D // H)
    assert flops.attention == L * (forward + round(2.5 * forward))
    assert flops.attention_kind == "useful"
    assert flops.total == flops.dense + flops.attention


def test_sliding_window_is_cheaper_by_its_allowed_pairs():
    window = 3
    full, local = _flops("full"), _flops("sliding_window", window=window)
    i = torch.arange(N)
    pairs = int(((i[:, None] - i[None, :]).abs() <= window).sum())  # counted by brute force
    assert local.dense == full.dense
    assert local.attention * N * N == full.attention * pairs
    assert local.attention < full.attention / 2


def test_counting_leaves_the_random_state_and_the_mode_alone():
    model = _classifier("full")
    model.train()
    before = torch.get_rng_state()
    count_step_flops(model, lambda: model(torch.zeros(2, 8, dtype=torch.long)))
    assert torch.equal(torch.get_rng_state(), before)
    assert model.training
    assert all(not module._forward_hooks and not module._forward_pre_hooks
               for module in model.modules())


def test_a_budget_buys_floor_budget_over_step_flops_with_the_schedule_stretched():
    train = TrainSettings(steps=400, warmup_steps=40, eval_every=100, checkpoint_every=50,
                          budget_x=1)
    same = matched_budget(train, 1000, 1000)
    assert same.train.steps == 400 and same.train.warmup_steps == 40  # the reference at 1x
    assert same.flop_budget == 400_000 and same.columns()["train_flops"] == 400_000
    dearer = matched_budget(TrainSettings(**{**vars(train), "budget_x": 0.5}), 3000, 1000)
    assert dearer.flop_budget == 200_000
    assert dearer.train.steps == 66  # floor(200000 / 3000)
    assert dearer.train.warmup_steps == round(40 * 66 / 400)
    assert dearer.train.eval_every == round(100 * 66 / 400)  # as many validations as at 400
    assert dearer.train.checkpoint_every == 50
    assert dearer.columns()["train_flops"] == 66 * 3000 <= dearer.flop_budget
    cheaper = matched_budget(TrainSettings(**{**vars(train), "budget_x": 2}), 250, 1000)
    assert cheaper.train.steps == 3200 and cheaper.train.eval_every == 800
    assert flop_budget(0.1, 10**12, 3) == 3 * 10**11  # exact at FLOP counts past 2**53


def test_a_budget_too_small_for_one_step_names_the_setting():
    with pytest.raises(ConfigError, match=r"train\.budget_x: must buy at least one step"):
        matched_budget(TrainSettings(steps=2, budget_x=0.1), 1000, 1000)


@pytest.mark.parametrize("value", [0, -1, True, "2", float("nan"), float("inf")])
def test_bad_budgets_name_the_setting(value):
    with pytest.raises(ConfigError, match=r"train\.budget_x: must be a number > 0") as err:
        TrainSettings(budget_x=value)
    assert err.value.key == "train.budget_x"


def test_a_budget_override_reaches_the_train_settings_as_one_json():
    one = task_settings("listops", "tiny", {"train": {"budget_x": 1}})
    assert one.train.budget_x == 1.0 and isinstance(one.train.budget_x, float)
    assert one.to_json() == task_settings("listops", "tiny", {"train": {"budget_x": 1.0}}).to_json()
    assert task_settings("listops", "tiny").train.budget_x is None


GRID = {"name": "g", "kind": "quality", "preset": "tiny", "tasks": ["listops", "recall"],
        "variants": [{"name": "full"}, {"name": "sliding_window"}], "seeds": [0, 1]}


def test_a_budget_axis_adds_one_unit_per_budget_task_variant_seed_and_multiple(tmp_path):
    plain = units(parse_grid(GRID), tmp_path)
    config = parse_grid({**GRID, "budgets": {"tasks": ["recall"], "x": [0.5, 1, 2]}})
    found = units(config, tmp_path)
    assert config.budget_tasks == ("recall",) and config.budget_x == (0.5, 1.0, 2.0)
    assert [u.unit_id for u in found[:len(plain)]] == [u.unit_id for u in plain]  # ids kept
    extra = found[len(plain):]
    assert len(extra) == 1 * 2 * 2 * 3  # task x variants x seeds x multiples
    assert {u.spec["task"] for u in extra} == {"recall"}
    assert sorted(budget_of(u.spec["overrides"]) for u in extra) == sorted([0.5, 1.0, 2.0] * 4)
    assert len({u.unit_id for u in found}) == len(found)
    assert len({u.spec["out"] for u in found}) == len(found)
    assert all("budget" in u.spec["out"] for u in extra)
    assert all(c in QUALITY_COLUMNS for c in BUDGET_COLUMNS)


@pytest.mark.parametrize("budgets, key", [
    ({"tasks": ["text"], "x": [1]}, "budgets.tasks"),  # not a task of the grid
    ({"tasks": ["recall"], "x": [0]}, "budgets.x"),
    ({"tasks": ["recall"], "x": []}, "budgets.x"),
    ({"tasks": ["recall"]}, "budgets"),
])
def test_bad_budget_axes_name_the_key(budgets, key):
    with pytest.raises(ConfigError) as err:
        parse_grid({**GRID, "budgets": budgets})
    assert err.value.key == key and f"'{key}'" in str(err.value)


def _rows() -> pd.DataFrame:
    rows = []
    for label, per_step in (("full", 4e9), ("sliding_window(window=4)", 1e9)):
        for x in (0.5, 1.0):
            for seed, value in ((0, 0.5 + x / 10), (1, 0.6 + x / 10)):
                steps = int(x * 400 * 4e9 // per_step)
                rows.append({"task": "recall", "label": label, "metric": "accuracy",
                             "split": "test", "condition": "", "status": "ok", "seed": seed,
                             "value": value, "steps": steps, "budget_x": x,
                             "flop_budget": x * 400 * 4e9, "flops_per_step": per_step,
                             "train_flops": steps * per_step})
    equal = {**rows[0], "budget_x": None, "label": "full", "value": 0.9}
    return pd.DataFrame([*rows, equal])


def test_the_main_table_never_mixes_budget_rows():
    main, budget = split_budget(_rows())
    assert len(main) == 1 and main.value.iloc[0] == 0.9
    assert len(budget) == 8 and budget.budget_x.notna().all()


def test_the_budget_table_gives_steps_and_metric_per_budget():
    _, budget = split_budget(_rows())
    text = budget_table(budget)
    assert "## Quality at matched compute" in text and "| 0.5x" in text and "| 1x" in text
    line = next(row for row in text.splitlines() if "sliding_window" in row)
    assert "(800 steps)" in line and "(1600 steps)" in line  # 4x cheaper: 4x the steps
    assert "60.0 ± 7.1" in line  # seeds 0.55 and 0.65, in %
    assert budget_table(budget.iloc[0:0]) == ""


def test_the_budget_figure_is_written(tmp_path):
    _, budget = split_budget(_rows())
    paths = plot_budget(budget, tmp_path)
    assert [p.name for p in paths] == ["budget.png", "budget.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert json.loads(json.dumps(list(map(str, paths))))  # plain paths


def test_a_budget_run_trains_the_steps_its_flops_buy_and_records_them(tmp_path):
    from bench.quality.train import METRICS, RunSpec, train_run

    def run(variant: str, x: float, out: str) -> tuple[dict, dict]:
        spec = RunSpec(task="recall", variant=variant, preset="tiny", seed=0,
                       out=str(tmp_path / out), overrides={"train": {"budget_x": x}})
        rows = train_run(spec, log=lambda _: None)
        saved = json.loads((tmp_path / out / "settings.json").read_text())
        assert json.loads((tmp_path / out / METRICS).read_text()) == json.loads(json.dumps(rows))
        return rows[0], saved

    steps = task_settings("recall", "tiny").train.steps  # 8
    full, saved = run("full", 0.5, "full")
    assert full["steps"] == steps // 2 == saved["schedule"]["steps"]
    assert full["budget_x"] == 0.5 and full["flop_budget"] == full["flops_per_step"] * steps // 2
    assert full["train_flops"] == full["steps"] * full["flops_per_step"] <= full["flop_budget"]
    assert json.loads(full["settings"])["train"]["steps"] == steps  # the settings asked for
    local, _ = run("sliding_window", 1.0, "local")
    assert local["flops_per_step"] < full["flops_per_step"]
    assert local["flop_budget"] == 2 * full["flop_budget"]  # the reference is full attention
    assert local["steps"] == local["flop_budget"] // local["flops_per_step"] > steps
