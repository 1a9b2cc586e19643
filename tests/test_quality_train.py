"""Training runs: a killed run resumes to exactly the uninterrupted result, the test split is
evaluated on the best-validation checkpoint, checkpoints are safetensors, and a variant
that cannot serve a part of a model says so."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.engine.threads import torch_threads
from bench.quality.checkpoint import load_checkpoint, save_checkpoint
from bench.quality.settings import TrainSettings
from bench.quality.train import METRICS, RunSpec, train_run
from bench.quality.trainer import BEST, LAST, learning_rate

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {"train": {"steps": 16, "eval_every": 4, "checkpoint_every": 4, "batch_size": 8},
             "model": {"dropout": 0.1}}  # dropout: the RNG state must survive the kill too
KILL_AT = 7  # after the step-4 checkpoint, before the step-8 one

KILLED_RUN = """
import os, signal, sys
from bench.quality.train import RunSpec, train_run
spec = RunSpec(**__import__("json").loads(sys.argv[1]))
def on_step(step, loss, rate):
    if step == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)
train_run(spec, log=lambda _: None, on_step=on_step)
"""


def _spec(out: Path, **changes) -> RunSpec:
    base = dict(task="recall", variant="sliding_window", preset="tiny", seed=3, out=str(out),
                overrides=OVERRIDES)
    return RunSpec(**{**base, **changes})


def _values(rows: list[dict]) -> list[tuple]:
    return [(r["split"], r["metric"], r["condition"], r["value"], r["best_step"]) for r in rows]


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_killed_training_resumes_to_the_uninterrupted_result(tmp_path):
    clean = train_run(_spec(tmp_path / "clean"), log=lambda _: None)
    spec = _spec(tmp_path / "killed")
    script = KILLED_RUN.format(kill_at=KILL_AT)
    killed = subprocess.run([sys.executable, "-c", script, json.dumps(spec.to_dict())], cwd=ROOT)
    assert killed.returncode == -9  # SIGKILL, mid-run
    _, meta = load_checkpoint(tmp_path / "killed" / LAST)
    assert meta["progress"]["step"] == 4 and not (tmp_path / "killed" / METRICS).exists()
    ambient = torch.get_num_threads()
    with torch_threads(max(1, ambient - 1)):  # another thread count around the resume: the
        resumed = train_run(spec, log=lambda _: None)  # checkpoint's own count is used
        assert torch.get_num_threads() == max(1, ambient - 1)  # and the scope's is restored
    assert _values(resumed) == _values(clean)
    a, _ = load_checkpoint(tmp_path / "clean" / LAST)
    b, _ = load_checkpoint(tmp_path / "killed" / LAST)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_the_test_split_is_evaluated_on_the_best_validation_checkpoint(tmp_path):
    from models import create_model

    rows = train_run(_spec(tmp_path), log=lambda _: None)
    best, meta = load_checkpoint(tmp_path / BEST)
    (head,) = [r for r in rows if r["split"] == "test" and r["metric"] == "accuracy"
               and not r["condition"]]
    assert head["best_step"] == meta["step"] and head["steps"] == 16
    assert head["train_tokens_per_s"] > 0 and head["param_count"] > 0
    settings = json.loads(head["settings"])
    from bench.quality.train import build

    _, task, _, parts = build(_spec(tmp_path))
    task.prepare()
    model = create_model("encoder_classifier", "mini", **parts.kwargs,
                         **{**task.model_overrides(), **settings["model"]})
    model.load_state_dict({k[len("model."):]: v for k, v in best.items()})
    model.eval()
    with torch.no_grad():
        (accuracy, *_rest) = task.evaluate(model, "test", limit=None, batch_size=8, final=False)
    assert accuracy.value == pytest.approx(head["value"])


def test_checkpoints_are_safetensors_and_keep_tied_weights(tmp_path):
    shared = torch.randn(4, 3)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"emb": shared, "head": shared, "other": torch.ones(2)}, {"step": 7})
    header = json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert set(header) - {"__metadata__"} == {"emb", "other"}  # stored once, no pickle
    tensors, meta = load_checkpoint(path)
    assert meta == {"step": 7} and tensors["head"] is tensors["emb"]
    assert torch.equal(tensors["head"], shared)


def test_learning_rate_warms_up_then_decays_to_its_floor():
    train = TrainSettings(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, train) == pytest.approx(0.1)
    assert learning_rate(9, train) == pytest.approx(1.0)
    assert learning_rate(10, train) == pytest.approx(1.0)
    assert learning_rate(55, train) == pytest.approx(0.1 + 0.9 * 0.5)
    assert learning_rate(100, train) == pytest.approx(0.1)
    linear = TrainSettings(steps=100, lr=1.0, warmup_steps=0, schedule="linear", min_lr_ratio=0)
    assert learning_rate(50, linear) == pytest.approx(0.5)
    assert all(math.isfinite(learning_rate(s, linear)) for s in range(100))


def test_a_variant_that_cannot_be_a_decoder_is_unsupported_not_replaced(tmp_path):
    (row,) = train_run(_spec(tmp_path, task="bytelm", variant="nystrom"), log=lambda _: None)
    assert row["status"] == "unsupported" and "no causal form" in row["reason"]
    from bench.quality.train import build

    *_, parts = build(_spec(tmp_path, task="translate", variant="nystrom"))
    assert parts.unsupported is None
    assert "encoder=nystrom" in parts.description
    assert "decoder self-attention=causal (nystrom has no causal form)" in parts.description
    assert parts.kwargs["decoder_attention"] == "causal"


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_the_train_command_end_to_end(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.cli", "train", "listops", "--variant", "dilated",
         "--param", "dilation=2", "--preset", "tiny", "--seed", "1", "--out", str(tmp_path),
         "--set", "train.steps=6"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "test  accuracy:" in result.stdout and "best step" in result.stdout
    rows = json.loads((tmp_path / METRICS).read_text())
    assert rows[0]["label"] == "dilated(dilation=2, window=4)" and rows[0]["steps"] == 6
    assert json.loads((tmp_path / "settings.json").read_text())["settings"]["train"]["steps"] == 6
