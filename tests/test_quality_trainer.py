"""The trainer reads training losses on the host each step on the CPU, and on CUDA only at a
validation or checkpoint step, in one transfer; a non-finite loss is found at its own step."""

from __future__ import annotations

import math

import torch

from bench.quality.checkpoint import load_checkpoint
from bench.quality.train import RunSpec, build
from bench.quality.trainer import LAST, LossReader, Trainer


def test_losses_are_read_at_once_unless_deferred():
    reader = LossReader(defer=False)
    assert reader.add(0, torch.tensor(2.5)) == [(0, 2.5)]
    deferred = LossReader(defer=True)
    assert deferred.add(0, torch.tensor(2.5)) == [] and deferred.add(1, torch.tensor(2.0)) == []
    assert deferred.add(2, torch.tensor(1.5, dtype=torch.bfloat16), now=True) == [(0, 2.5), (1, 2.0), (2, 1.5)]
    assert deferred.add(3, torch.tensor(1.0), now=True) == [(3, 1.0)]  # nothing read twice


def test_a_non_finite_loss_keeps_its_step_when_read_later():
    deferred = LossReader(defer=True)
    for step, value in enumerate((1.0, math.nan, 3.0)):
        read = deferred.add(step, torch.tensor(value), now=step == 2)
    bad = [(s, v) for s, v in read if not math.isfinite(v)]
    assert [s for s, _ in bad] == [1]


# Checkpoints keep the CUDA generators beside the CPU one and a resume restores them (torch.cuda
# replaced by fakes that record what is read and set).
class _FakeCuda:
    """Two CUDA devices whose generator states are byte tensors; records every set."""

    def __init__(self) -> None:
        self.states = [torch.full((16,), 7, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
        self.set_calls: list[list[torch.Tensor]] = []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: self.set_calls.append(
            [s.clone() for s in states]))


def _trainer(out) -> Trainer:
    from models import create_model

    spec = RunSpec(task="recall", variant="sliding_window", preset="tiny", seed=3, out=str(out))
    settings, task, _, _ = build(spec)
    task.prepare()
    torch.manual_seed(0)
    model = create_model(task.model_kind, "mini", attention="sliding_window",
                         attention_params={"window": 4}, **task.model_overrides())
    out.mkdir(parents=True, exist_ok=True)
    return Trainer(spec, settings, task, model, "fingerprint", log=lambda _: None)


def test_a_checkpoint_keeps_and_a_resume_restores_every_cuda_generator(tmp_path, monkeypatch):
    cuda = _FakeCuda()
    cuda.install(monkeypatch)
    trainer = _trainer(tmp_path)
    trainer.save_last()
    tensors, _ = load_checkpoint(tmp_path / LAST)
    assert torch.equal(tensors["rng.cuda.0"], cuda.states[0])
    assert torch.equal(tensors["rng.cuda.1"], cuda.states[1])
    cpu_then = tensors["rng.torch"]
    torch.rand(3)  # the generators move on
    cuda.states = [s + 1 for s in cuda.states]
    assert _trainer(tmp_path).resume()
    (restored,) = cuda.set_calls
    assert [s.tolist() for s in restored] == [[7] * 16, [9] * 16]
    assert torch.equal(torch.get_rng_state(), cpu_then)


def test_without_cuda_only_the_cpu_generator_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = _trainer(tmp_path)
    trainer.save_last()
    tensors, _ = load_checkpoint(tmp_path / LAST)
    assert not [k for k in tensors if k.startswith("rng.cuda")]
    assert _trainer(tmp_path).resume()
