"""Self-pretraining: the corruption touches only real tokens and is a pure function of (seed,
step), each phase has its own schedule, the optimizer starts afresh for fine-tuning, a run
killed during pretraining resumes to the uninterrupted result, and tasks without an
objective say so."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.engine.config import ConfigError
from bench.quality.checkpoint import load_checkpoint
from bench.quality.pretrain import corrupt, phase_settings
from bench.quality.settings import TrainSettings, settings_that_apply, task_settings
from bench.quality.train import RunSpec, train_run
from bench.quality.trainer import LAST, learning_rate

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {"train": {"steps": 16, "pretrain_steps": 8, "eval_every": 4, "checkpoint_every": 2,
                       "batch_size": 8}}
KILLED_RUN = """
import os, signal, sys
from bench.quality.train import RunSpec, train_run
spec = RunSpec(**__import__("json").loads(sys.argv[1]))
def on_step(step, loss, rate):
    if step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
train_run(spec, log=lambda _: None, on_step=on_step)
"""


def _spec(out: Path) -> RunSpec:
    return RunSpec(task="text", variant="full", preset="tiny", seed=1, out=str(out),
                   overrides=OVERRIDES)


def test_corruption_replaces_only_real_tokens_and_repeats_for_a_seed_and_step():
    ids = torch.arange(1, 201).reshape(4, 50) % 17 + 1
    key_mask = torch.ones(4, 50, dtype=torch.bool)
    key_mask[1, 10:] = False
    key_mask[2, 1:] = False  # one real token: it is the target
    noisy, where = corrupt(ids, key_mask, 18, 0.3, seed=0, step=7)
    assert not where[~key_mask].any() and torch.equal(noisy[~where], ids[~where])
    assert where.any(dim=1).all() and where[2, 0]
    assert 0.2 < where[0].float().mean() < 0.4
    again, where_again = corrupt(ids, key_mask, 18, 0.3, seed=0, step=7)
    assert torch.equal(again, noisy) and torch.equal(where_again, where)
    _, other = corrupt(ids, key_mask, 18, 0.3, seed=0, step=8)
    assert not torch.equal(other, where)


def test_each_phase_warms_up_and_decays_on_its_own():
    train = TrainSettings(steps=100, pretrain_steps=40, lr=1.0, warmup_steps=10,
                          min_lr_ratio=0.0)
    plain = replace(train, pretrain_steps=0)
    assert learning_rate(0, train) == pytest.approx(0.1)  # pretraining warms up
    assert learning_rate(39, train) < 0.01  # and decays over its 40 steps
    assert learning_rate(40, train) == pytest.approx(0.1)  # fine-tuning warms up again
    assert learning_rate(45, train) == pytest.approx(learning_rate(5, plain))
    assert phase_settings(70, train)[0] == 30 and phase_settings(70, train)[1].steps == 60
    assert phase_settings(70, plain) == (70, plain)


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_run_killed_while_pretraining_resumes_to_the_uninterrupted_result(tmp_path):
    clean = train_run(_spec(tmp_path / "clean"), log=lambda _: None)
    spec = _spec(tmp_path / "killed")
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, json.dumps(spec.to_dict())], cwd=ROOT)
    assert killed.returncode == -9
    _, meta = load_checkpoint(tmp_path / "killed" / LAST)
    assert meta["progress"]["step"] == 4  # mid-pretraining
    resumed = train_run(spec, log=lambda _: None)
    values = [(r["split"], r["metric"], r["value"], r["best_step"]) for r in clean]
    assert [(r["split"], r["metric"], r["value"], r["best_step"]) for r in resumed] == values
    assert min(h["step"] for h in meta["progress"]["history"] or [{"step": 99}]) > 8
    _, final = load_checkpoint(tmp_path / "clean" / LAST)
    assert min(h["step"] for h in final["progress"]["history"]) > 8  # no selection before fine-tuning
    assert all(r["best_step"] > 8 for r in clean if r["split"] == "test")


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_pretraining_trains_the_encoder_and_leaves_the_classifier_head_alone(tmp_path):
    from bench.quality.train import _model, build

    spec = _spec(tmp_path)
    script = KILLED_RUN.replace("step == 5", "step == 8")  # killed right after pretraining
    assert subprocess.run([sys.executable, "-c", script, json.dumps(spec.to_dict())],
                          cwd=ROOT).returncode == -9
    after, meta = load_checkpoint(tmp_path / LAST)
    assert meta["progress"]["step"] == 8
    settings, task, _, parts = build(spec)
    task.prepare()
    torch.manual_seed(spec.seed)
    initial = _model(spec, settings, task, parts).state_dict()
    assert torch.equal(after["model.head.weight"], initial["head.weight"])  # no gradient reached it
    assert not torch.equal(after["model.token_emb.weight"], initial["token_emb.weight"])
    assert not torch.equal(after["model.encoder.blocks.0.ffn.fc1.weight"],
                           initial["encoder.blocks.0.ffn.fc1.weight"])


def test_settings_errors_and_the_tasks_without_an_objective(tmp_path):
    with pytest.raises(ConfigError, match=r"train.pretrain_steps: must be less than train.steps \(10\)"):
        TrainSettings(steps=10, pretrain_steps=10)
    with pytest.raises(ConfigError, match=r"train.pretrain_mask_rate: must be a number in \(0, 1\]"):
        TrainSettings(pretrain_mask_rate=0)
    spec = RunSpec(task="bytelm", variant="full", preset="tiny", seed=0, out=str(tmp_path),
                   overrides={"train": {"steps": 4, "pretrain_steps": 2}})
    with pytest.raises(ConfigError, match="train.pretrain_steps: task 'bytelm' .* has no self-pretraining"):
        train_run(spec, log=lambda _: None)
    # no pretraining recorded in an older row and pretrain_steps 0 now: the same run
    now = task_settings("text", "tiny").to_json()
    older = json.loads(now)
    for key in ("pretrain_steps", "pretrain_mask_rate"):
        older["train"].pop(key)
    assert settings_that_apply(json.dumps(older), "full", {}) == settings_that_apply(now, "full", {})
