"""The optimiser's parameter groups: weight decay on matrices only, and the relative-position
bias tables in their own group (no weight decay, a learning-rate multiplier) that the
schedule keeps through every step."""

from __future__ import annotations

import pytest
import torch

from attn.position_bias import RelativePositionBias
from bench.quality.settings import TrainSettings
from bench.quality.train import RunSpec, build
from bench.quality.trainer import Trainer, make_optimizer
from models import create_model


def _model(attention: str, **params):
    return create_model("encoder_classifier", "mini", attention=attention, attention_params=params,
                        vocab_size=11, num_classes=3, max_len=32)


def _group_of(optimizer: torch.optim.Optimizer, parameter: torch.Tensor) -> dict:
    (group,) = [g for g in optimizer.param_groups if any(p is parameter for p in g["params"])]
    return group


def test_bias_tables_get_no_weight_decay_and_their_own_learning_rate():
    model = _model("relative", bias="learned", max_distance=8)
    train = TrainSettings(weight_decay=0.1, position_bias_lr_scale=25.0)
    optimizer = make_optimizer(model, train)
    tables = [m.table for m in model.modules() if isinstance(m, RelativePositionBias)]
    assert tables and all(t.dim() == 2 for t in tables)  # 2-D: a dim() rule alone would decay them
    for table in tables:
        group = _group_of(optimizer, table)
        assert group["weight_decay"] == 0.0
        assert group["lr_scale"] == 25.0
    matrices = [p for n, p in model.named_parameters() if p.dim() >= 2 and "table" not in n]
    assert all(_group_of(optimizer, p)["weight_decay"] == 0.1 for p in matrices)
    vectors = [p for p in model.parameters() if p.dim() < 2]
    assert all(_group_of(optimizer, p)["weight_decay"] == 0.0 for p in vectors)
    counted = sum(len(g["params"]) for g in optimizer.param_groups)
    assert counted == len(list(model.parameters()))  # every parameter in exactly one group


def test_a_model_without_bias_tables_has_no_bias_group():
    optimizer = make_optimizer(_model("full"), TrainSettings())
    assert [g["lr_scale"] for g in optimizer.param_groups] == [1.0, 1.0]


def test_a_training_step_moves_a_bias_entry_by_the_scaled_learning_rate(tmp_path):
    # Adam's first update is m / sqrt(v) = sign(g) per entry: the Trainer's first step (no
    # warm-up) moves every bias entry with a gradient by lr * lr_scale, and a matrix by lr.
    spec = RunSpec(task="recall", variant="relative", params={"bias": "learned"}, preset="tiny",
                   seed=0, out=str(tmp_path), overrides={"train": {
                       "warmup_steps": 0, "weight_decay": 0.0, "lr": 1e-3, "grad_clip": 0.0,
                       "position_bias_lr_scale": 30.0}})
    settings, task, _params, parts = build(spec)
    task.prepare()
    torch.manual_seed(0)
    model = create_model(task.model_kind, "mini", **parts.kwargs,
                         **{**task.model_overrides(), **settings.model})
    trainer = Trainer(spec, settings, task, model, "test", log=lambda _: None)
    table = next(m.table for m in model.modules() if isinstance(m, RelativePositionBias))
    weight = next(p for n, p in model.named_parameters() if p.dim() == 2 and "table" not in n
                  and "emb" not in n)
    table_before, weight_before = table.detach().clone(), weight.detach().clone()
    trainer._step(0)
    assert (table.detach() - table_before).abs().max().item() == pytest.approx(30 * 1e-3, rel=1e-3)
    assert (weight.detach() - weight_before).abs().max().item() == pytest.approx(1e-3, rel=1e-3)


def test_the_multiplier_is_validated():
    with pytest.raises(ValueError, match="train.position_bias_lr_scale: must be a number >= 0"):
        TrainSettings(position_bias_lr_scale=-1)
