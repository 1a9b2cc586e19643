"""The interface every quality task implements (seeded splits, the model it trains, a step's batch, the loss,
the metrics), and the classification, image and generated tasks' shared cores (docs/extending.md)."""

from __future__ import annotations

import itertools
import math
import time
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.devices import module_device
from attn.validation import invalid, require_int_list

Split = dict[str, Tensor]
SPLITS = ("train", "val", "test")


def to_model_device(data: Any, model: nn.Module) -> Any:
    """``data`` (a tensor, or a dict of tensors such as a :data:`Split`) on ``model``'s device."""
    device = module_device(model)
    if isinstance(data, Tensor):
        return data.to(device)
    return {k: v.to(device) for k, v in data.items()}


@dataclass(frozen=True)
class Metric:
    """One measured number; ``condition`` (e.g. ``distance=64``) is empty for the headline number."""

    name: str
    value: float
    condition: str = ""
    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class DataSettings:
    """A task's data settings (its ``Data``): a typed field with its default per key of its ``data`` section."""

    @classmethod
    def of(cls, task: str, data: Mapping[str, Any]) -> Self:
        """``data`` typed; ``ValueError`` names the task and an unknown key or a wrong type."""
        hints, allowed = typing.get_type_hints(cls), [f.name for f in fields(cls)]
        for key, value in data.items():
            if key not in allowed:
                raise ValueError(f"{task}: unknown data setting {key!r}; allowed keys are {allowed}")
            if not _fits(value, hints[key]):
                kind = str(hints[key]) if typing.get_args(hints[key]) else hints[key].__name__
                raise ValueError(f"{task}: data setting {key!r} must be {kind}; got {value!r}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _fits(value: Any, kind: Any) -> bool:
    """Whether ``value`` is a ``kind`` (a list is a tuple, an int a float, a bool neither)."""
    if isinstance(kind, types.UnionType):
        return any(_fits(value, k) for k in typing.get_args(kind))
    if typing.get_origin(kind) is tuple:
        return isinstance(value, (list, tuple)) and all(_fits(v, typing.get_args(kind)[0]) for v in value)
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, (int, float) if kind is float else kind)


class Task(ABC):
    """A quality task (see the module docstring)."""

    name: ClassVar[str] = ""
    #: the task's data settings (a :class:`DataSettings` subclass)
    Data: ClassVar[type[DataSettings]] = DataSettings
    model_kind: ClassVar[str] = "encoder_classifier"
    #: the headline metric and whether larger is better
    metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True
    #: what model selection on ``val`` compares (defaults to the headline metric)
    selection_metric: ClassVar[str | None] = None
    #: True when the model's self-attention must be causal (a decoder)
    causal_self_attention: ClassVar[bool] = False

    def __init__(self, data: Mapping[str, Any], seed: int) -> None:
        self.data: Any = self.Data.of(self.name or type(self).__name__, data)
        self.seed = seed
        self.splits: dict[str, Split] = {}

    @property
    def selection(self) -> tuple[str, bool]:
        """``(metric name, higher is better)`` used to pick the best checkpoint."""
        if self.selection_metric is None:
            return self.metric, self.higher_is_better
        return self.selection_metric, False

    @abstractmethod
    def prepare(self) -> None:
        """Load or generate the data and fill ``self.splits`` (seeded, deterministic)."""

    @abstractmethod
    def model_overrides(self) -> dict[str, Any]:
        """Model settings the data dictates (vocabulary, classes, maximum length, ...)."""

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Input length of one example (the length the attention sees)."""

    def num_examples(self, split: str) -> int:
        first = next(iter(self.splits[split].values()))
        return int(first.shape[0])

    def train_batch(self, step: int, batch_size: int) -> Split:
        """The training batch of ``step``: a pure function of (seed, step)."""
        gen = np.random.default_rng([self.seed, step, 0x7A5C])
        index = torch.from_numpy(gen.integers(0, self.num_examples("train"), batch_size))
        return {k: v[index] for k, v in self.splits["train"].items()}

    def batches(self, split: str, batch_size: int, limit: int | None = None) -> Iterator[Split]:
        """The first ``limit`` examples of ``split`` (all by default), in order."""
        total = self.num_examples(split) if limit is None else min(limit, self.num_examples(split))
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield {k: v[start:stop] for k, v in self.splits[split].items()}

    @abstractmethod
    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        """Training loss of a batch and the number of input tokens it holds."""

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str, *, limit: int | None, batch_size: int,
                 final: bool) -> list[Metric]:
        """Metrics on ``split`` (``final``: the one test evaluation, which may add per-condition metrics)."""

    @staticmethod
    def accuracy_by(prefix: str, values: Tensor, hit: Tensor) -> list[Metric]:
        """Mean ``hit`` (1/0, or a probability of being right) at each distinct ``v`` of ``values``: ``prefix + v``."""
        return [Metric("accuracy", float(hit[values == v].mean()), f"{prefix}{v}") for v in values.unique().tolist()]

    @staticmethod
    def accuracy_by_bucket(prefix: str, values: Tensor, hit: Tensor, edges: Sequence[int]) -> list[Metric]:
        """Mean ``hit`` where ``values`` lie in ``(previous edge, edge]``: ``prefix + edge`` (empty ones left out)."""
        found, low = [], 0
        for edge in edges:
            sel = (values > low) & (values <= edge)
            if bool(sel.any()):
                found.append(Metric("accuracy", float(hit[sel].mean()), f"{prefix}{edge}"))
            low = edge
        return found

    def bucket_edges(self, name: str, top: int) -> tuple[int, ...]:
        """Upper edges of buckets: data setting ``name``'s increasing edges below ``top``, then ``top``."""
        edges = require_int_list(name, getattr(self.data, name))
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise invalid(name, f"must be increasing; got {list(edges)}")
        return (*(e for e in edges if e < top), top)


def pads_eval_batches(model: nn.Module) -> bool:
    """Whether a short evaluation batch is padded to the training shape: off the CPU."""
    return module_device(model).type != "cpu"


def padded_rows(batch: Split, size: int) -> Split:
    """``batch`` with its last row repeated up to ``size`` rows."""
    return {k: torch.cat([v, v[-1:].expand(size - len(v), *v.shape[1:])]) for k, v in batch.items()}


class ClassificationTask(Task):
    """Splits with ``ids`` (and ``key_mask``) and ``labels``; ``encoder_classifier``; accuracy."""

    vocab_size: int = 0
    num_classes: int = 2
    pooling: ClassVar[str] = "mean"

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "num_classes": self.num_classes,
                "max_len": self.seq_len + 8, "pooling": self.pooling}

    @property
    def seq_len(self) -> int:
        return int(self.splits["train"]["ids"].shape[1])

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        batch = to_model_device(batch, model)
        return model(batch["ids"], batch.get("key_mask"))  # (B, C)

    def eval_logits(self, model: nn.Module, batch: Split, batch_size: int) -> Tensor:
        """``self.logits`` of an evaluation batch; off the CPU a short one is padded to ``batch_size`` rows and cut
        back, so a kernel that compiles per shape (flex) meets one shape (on the CPU, BLAS at another size may
        change the last digit)."""
        rows = len(next(iter(batch.values())))
        if rows == batch_size or not pads_eval_batches(model):
            return self.logits(model, batch)
        return self.logits(model, padded_rows(batch, batch_size))[:rows]

    def batch_tokens(self, batch: Split) -> int:
        """Input tokens of a batch (padding excluded)."""
        return int(batch["key_mask"].sum()) if "key_mask" in batch else int(batch["ids"].numel())

    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        batch = to_model_device(batch, model)
        return F.cross_entropy(self.logits(model, batch), batch["labels"]), self.batch_tokens(batch)

    @torch.no_grad()
    def predictions(self, model: nn.Module, split: str, limit: int | None,
                    batch_size: int) -> tuple[Tensor, Tensor, int, float]:
        """Predicted and true labels of the first ``limit`` examples, tokens read, seconds."""
        preds, labels, tokens = [], [], 0
        start = time.perf_counter()
        for batch in self.batches(split, batch_size, limit):
            preds.append(self.eval_logits(model, batch, batch_size).argmax(dim=-1).cpu())  # (b,)
            labels.append(batch["labels"])
            tokens += self.batch_tokens(batch)
        return torch.cat(preds), torch.cat(labels), tokens, time.perf_counter() - start

    def majority_accuracy(self, split: str, count: int) -> Metric:
        """Accuracy of always answering the most frequent training label (the chance level)."""
        train = self.splits["train"]["labels"]
        common = int(torch.bincount(train).argmax())
        labels = self.splits[split]["labels"][:count]
        return Metric("majority_accuracy", float((labels == common).float().mean()))

    def condition_metrics(self, split: str, preds: Tensor, labels: Tensor) -> list[Metric]:
        """Accuracy per condition of the first ``len(labels)`` examples of ``split``; none by default."""
        return []

    def evaluate(self, model: nn.Module, split: str, *, limit: int | None, batch_size: int,
                 final: bool) -> list[Metric]:
        preds, labels, tokens, seconds = self.predictions(model, split, limit, batch_size)
        accuracy = float((preds == labels).float().mean()) if len(labels) else math.nan
        metrics = [Metric("accuracy", accuracy, "", tokens, seconds)]
        if final:
            metrics.append(self.majority_accuracy(split, len(labels)))
            metrics += self.condition_metrics(split, preds, labels)
        return metrics


class PatchedImageTask(ClassificationTask):
    """A classification read by the ``vit`` model: ``images (n, 1, S, S)`` in [0, 1] and ``labels``."""

    @property
    def image_size(self) -> int:
        raise NotImplementedError

    @property
    def patch_size(self) -> int:
        return self.data.patch_size

    def model_overrides(self) -> dict[str, Any]:
        return {"image_size": self.image_size, "patch_size": self.patch_size, "in_channels": 1,
                "num_classes": self.num_classes, "pooling": self.pooling}

    @property
    def seq_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        return model(to_model_device(batch["images"], model))  # (B, C)

    def batch_tokens(self, batch: Split) -> int:
        return int(batch["labels"].numel()) * self.seq_len


def as_tensors(arrays: dict[str, np.ndarray], index: np.ndarray) -> Split:
    """Rows ``index`` of each array, as torch tensors (int64 ids, bool masks)."""
    out = {}
    for key, array in arrays.items():
        part = array[index]
        if part.dtype == np.bool_:
            out[key] = torch.from_numpy(np.ascontiguousarray(part))
        elif np.issubdtype(part.dtype, np.integer):
            out[key] = torch.from_numpy(np.ascontiguousarray(part).astype(np.int64))
        else:
            out[key] = torch.from_numpy(np.ascontiguousarray(part).astype(np.float32))
    return out


@dataclass(frozen=True)
class SplitSizes(DataSettings):
    """Data settings of a task whose three splits are drawn apart: their sizes and seed."""

    train_examples: int = 1000
    val_examples: int = 100
    test_examples: int = 100
    data_seed: int = 0


class GeneratedTask(Task):
    """A task whose split ``i`` (train, val, test) a generator draws with seed ``3 * data_seed + i``."""

    Data = SplitSizes

    @abstractmethod
    def generate(self, count: int, seed: int) -> dict[str, np.ndarray]:
        """``count`` examples drawn with ``seed``: arrays of one first dimension."""

    def prepare(self) -> None:
        for offset, split in enumerate(SPLITS):
            arrays = self.generate(getattr(self.data, f"{split}_examples"), self.data.data_seed * 3 + offset)
            self.splits[split] = as_tensors(arrays, np.arange(len(next(iter(arrays.values())))))
