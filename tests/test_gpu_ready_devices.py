"""Evaluation feeds the model on the model's device (checked on the CPU, see docs/gpu.md).

A CPU machine cannot hold tensors on two device types, so the check is in two parts:

* ``to_model_device`` moves a batch to the device of the model's parameters: shown with a
  model whose parameters live on the ``meta`` device (which a CPU machine has).
* every tensor each registered task hands its model, in training loss and in the full (final)
  evaluation, went through ``to_model_device``: the helper is replaced by one that marks what
  it returns as :class:`_Moved`; the marking follows every op (slicing, masking, ...), ops that
  mix marked and unmarked tensors fail the way CUDA/CPU mixing fails, and the model wrapper
  refuses unmarked inputs. On the old code (tasks fed CPU batches directly) the wrapper fails.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from attn.devices import module_device
from bench.quality.settings import task_settings
from bench.quality.tasks import base, get_task, list_tasks


class _Moved(Tensor):
    """A tensor standing for one on the model's device (a CUDA tensor, on a GPU run)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (Tensor.cpu, Tensor.numpy):  # back to the host: an ordinary tensor
            plain = [a.as_subclass(Tensor) if isinstance(a, Tensor) else a for a in args]
            return func(*plain, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a
                    if isinstance(t, Tensor)]
        if func is Tensor.__getitem__:  # CUDA tensors take CPU index tensors
            tensors = tensors[:1]
        if any(isinstance(t, _Moved) for t in tensors):
            host = [t for t in tensors if not isinstance(t, _Moved) and t.dim() > 0]
            if host:  # CUDA refuses a CPU tensor (other than a scalar) beside a CUDA one
                raise RuntimeError(f"{func}: a host tensor mixed with a device tensor")
        return super().__torch_function__(func, types, args, kwargs)


def _mark(data: Any, model: nn.Module) -> Any:
    if isinstance(data, Tensor):
        return data.as_subclass(_Moved)
    return {k: v.as_subclass(_Moved) for k, v in data.items()}


def _unmark(value: Any, calls: list[str], name: str) -> Any:
    if isinstance(value, Tensor):
        assert isinstance(value, _Moved), f"{name}: an input tensor not on the model's device"
        calls.append(name)
        return value.as_subclass(Tensor)
    return value


class _DeviceCheckingModel:
    """Wraps a model: every tensor argument of its forward and other methods must be marked;
    what it returns is marked (model outputs live on the model's device)."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.calls = model, []

    def _checked(self, fn: Any, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_unmark(a, self.calls, name) for a in args)
            kwargs = {k: _unmark(v, self.calls, name) for k, v in kwargs.items()}
            out = fn(*args, **kwargs)
            return out.as_subclass(_Moved) if isinstance(out, Tensor) else out
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked(self.model, "forward")(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.model, name)
        if callable(attr) and name not in ("parameters", "buffers", "eval", "train"):
            return self._checked(attr, name)
        return attr


def test_to_model_device_moves_a_batch_to_the_parameters_device():
    model = nn.Linear(2, 2).to("meta")
    batch = {"ids": torch.zeros(2, 3, dtype=torch.long), "mask": torch.ones(2, 3, dtype=torch.bool)}
    moved = base.to_model_device(batch, model)
    assert {v.device.type for v in moved.values()} == {"meta"}
    assert base.to_model_device(torch.zeros(3), model).device.type == "meta"
    assert base.to_model_device(batch, nn.Linear(2, 2))["ids"] is batch["ids"]  # same device: as is
    assert module_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU


@pytest.mark.parametrize("name", list_tasks())
def test_every_tensor_a_task_gives_its_model_went_to_the_model_device(name, monkeypatch):
    from models import create_model

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("bench.quality.tasks") and \
                hasattr(module, "to_model_device"):
            monkeypatch.setattr(module, "to_model_device", _mark)
    settings = task_settings(name, "tiny")
    task = get_task(name, settings.data, seed=0)
    task.prepare()
    torch.manual_seed(0)
    inner = create_model(task.model_kind, "mini", attention="sliding_window",
                         attention_params={"window": 4}, **{**task.model_overrides(), **settings.model})
    model = _DeviceCheckingModel(inner)
    loss, _ = task.loss(model, task.train_batch(0, 4))  # a CPU batch: the task moves it
    assert torch.isfinite(loss.as_subclass(Tensor))
    inner.eval()
    if name == "translate":
        task.data = dataclasses.replace(task.data, bleu_examples=2)
    with torch.no_grad():
        metrics = task.evaluate(model, "test", limit=4, batch_size=2, final=True)
    assert metrics and model.calls, "the model was never called"


class _RowCounting(nn.Module):
    """Wraps a model and records the batch size of every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, []

    def forward(self, *args: Any) -> Tensor:
        self.rows.append(len(args[0]))
        return self.model(*args)


@pytest.mark.parametrize("name", ["listops", "mqar"])
def test_off_the_cpu_a_short_last_eval_batch_runs_at_the_training_shape(name, monkeypatch):
    from models import create_model

    settings = task_settings(name, "tiny")
    task = get_task(name, settings.data, seed=0)
    task.prepare()
    torch.manual_seed(0)
    model = _RowCounting(create_model(task.model_kind, "mini", attention="full",
                                      **{**task.model_overrides(), **settings.model})).eval()
    with torch.no_grad():
        on_cpu = task.evaluate(model, "test", limit=6, batch_size=4, final=False)
        assert model.rows == [4, 2]  # on the CPU: as the batches come
        model.rows.clear()
        monkeypatch.setattr(base, "pads_eval_batches", lambda module: True)  # as on CUDA
        padded = task.evaluate(model, "test", limit=6, batch_size=4, final=False)
    assert model.rows == [4, 4]  # the last batch padded to the training shape
    assert [m.value for m in padded] == [m.value for m in on_cpu]  # over the 6 real examples only
