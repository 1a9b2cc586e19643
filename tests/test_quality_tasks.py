"""Every quality task on its real data (tiny preset): fixed seeded splits, a model that
trains on its batches, the headline metric, and splits that never share test material."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from attn.devices import module_device
from bench.quality.settings import task_settings
from bench.quality.tasks import base, get_task, list_tasks

HEADLINE = {"bytelm": "bits_per_byte", "translate": "loss"}  # the rest: accuracy


@pytest.fixture(scope="module", params=list_tasks())
def prepared(request):
    settings = task_settings(request.param, "tiny")
    task = get_task(request.param, settings.data, seed=0)
    task.prepare()
    return task, settings


def _model(task, settings):
    from models import create_model

    torch.manual_seed(0)
    return create_model(task.model_kind, "mini", attention="sliding_window",
                        attention_params={"window": 4}, **{**task.model_overrides(), **settings.model})


def test_splits_batches_loss_and_metric(prepared):
    task, settings = prepared
    assert set(task.splits) == {"train", "val", "test"}
    assert task.seq_len >= 4 * 4  # at least 4 windows of the tiny preset
    first, again = task.train_batch(3, 4), task.train_batch(3, 4)
    assert all(torch.equal(first[k], again[k]) for k in first)  # a pure function of (seed, step)
    other = task.train_batch(4, 4)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    model = _model(task, settings)
    loss, tokens = task.loss(model, first)
    loss.backward()
    assert torch.isfinite(loss) and tokens > 0
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model, "val", limit=8, batch_size=4, final=False)
    name = HEADLINE.get(task.name, "accuracy")
    (headline,) = [m for m in metrics if m.name == name and not m.condition]
    assert np.isfinite(headline.value) and headline.tokens > 0


def test_the_same_data_seed_gives_the_same_splits(prepared):
    task, settings = prepared
    again = get_task(task.name, settings.data, seed=5)  # another training seed, same data
    again.prepare()
    for split in ("train", "val", "test"):
        for key, value in task.splits[split].items():
            assert torch.equal(value, again.splits[split][key]), (split, key)


def test_classification_labels_and_chance(prepared):
    task, _ = prepared
    if "labels" not in task.splits["train"]:
        pytest.skip(f"{task.name} is not a classification task")
    labels = torch.cat([task.splits[s]["labels"].flatten() for s in ("train", "val", "test")])
    labels = labels[labels != -100]  # mqar labels every position, -100 where nothing is asked
    assert 0 <= int(labels.min()) and int(labels.max()) < task.num_classes
    chance = task.majority_accuracy("test", task.num_examples("test"))
    assert 0 < chance.value < 1


def test_image_test_examples_come_from_the_test_images_only():
    from bench.quality.data import fashion_mnist

    settings = task_settings("image", "tiny")
    task = get_task("image", settings.data, seed=0)
    task.prepare()
    test_images, _ = fashion_mnist.load("test")
    test_rows = {bytes(row) for row in test_images.reshape(len(test_images), -1).astype(np.uint8)}
    ours = task.splits["test"]["ids"].numpy().astype(np.uint8)
    assert all(bytes(row) in test_rows for row in ours)
    train_images, _ = fashion_mnist.load("train")
    train_rows = {bytes(r) for r in task.splits["train"]["ids"].numpy().astype(np.uint8)}
    val_rows = {bytes(r) for r in task.splits["val"]["ids"].numpy().astype(np.uint8)}
    assert not train_rows & val_rows and len(train_images) == 60000


def test_translation_chapters_never_straddle_splits():
    settings = task_settings("translate", "tiny")
    task = get_task("translate", settings.data, seed=0)
    task.prepare()
    chapters = {split: {ref.rsplit(":", 1)[0] for ref in refs}
                for split, refs in task.verse_refs.items()}
    assert not chapters["train"] & chapters["test"] and not chapters["val"] & chapters["test"]
    assert not chapters["train"] & chapters["val"]
    assert all("¶" not in text for text in task.references["test"])


def test_recall_reports_accuracy_per_distance():
    settings = task_settings("recall", "tiny")
    task = get_task("recall", settings.data, seed=0)
    task.prepare()
    model = _model(task, settings).eval()
    with torch.no_grad():
        metrics = task.evaluate(model, "test", limit=None, batch_size=8, final=True)
    conditions = {m.condition for m in metrics if m.name == "accuracy"}
    assert conditions == {"", *(f"distance={d}" for d in settings.data["distances"])}


def _input_rows(split: dict[str, torch.Tensor]) -> set[bytes]:
    inputs = split["ids"] if "ids" in split else split["images"]
    rows = inputs.reshape(len(inputs), -1).numpy()
    if "pair_ids" in split:  # a retrieval pair: either side may be a seen article
        rows = np.concatenate([rows, split["pair_ids"].numpy()])
    return {row.tobytes() for row in rows}


def test_no_test_input_is_also_a_training_input(prepared):
    task, _ = prepared
    train = getattr(task, "articles", None) or task.splits["train"]  # retrieval: the articles
    if "ids" not in train and "images" not in train:
        pytest.skip(f"{task.name} is split by position or by chapter (tested on its own)")
    seen = _input_rows(train)
    for split in ("val", "test"):
        assert not _input_rows(task.splits[split]) & seen, split


# Evaluation feeds the model on the model's device (docs/gpu.md): to_model_device is replaced by one that
# marks its tensors (_Moved), and the model wrapper refuses unmarked inputs, as CUDA refuses CPU tensors.
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
