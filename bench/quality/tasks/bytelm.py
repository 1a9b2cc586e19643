"""``bytelm``: byte-level language modelling of gensim's Wikipedia XML excerpt, in bits per byte, the test split
also read past the training length."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.quality.data import enwiki
from bench.quality.tasks.base import DataSettings, Metric, Split, Task, to_model_device
from bench.quality.tasks.registration import ConditionFigure, ConditionView, register_task

LN2 = math.log(2.0)


PRESETS = {
    "tiny": {
        "data": {"seq_len": 32, "eval_bytes": 1024, "extrapolation": [1, 2, 4]},
    },
    "small": {
        "note": ("enwiki excerpt of gensim's test data; trained on 256 bytes, evaluated at 1, 2, "
                 "4, 8x."),
        "data": {"seq_len": 256, "eval_bytes": 32768, "extrapolation": [1, 2, 4, 8]},
        "train": {"steps": 300},
    },
    "lra": {
        "data": {"seq_len": 1024, "eval_bytes": 262144, "extrapolation": [1, 2, 4, 8]},
    },
}


@register_task(
    "bytelm",
    order=7,
    presets=PRESETS,
    metric_title="bits/byte (lower is better)",
    conditions=(ConditionView(
        "bits_per_byte", "length=",
        "Bits per byte by evaluation length (test; trained at the first length)",
        figure=ConditionFigure("bytelm_length", "evaluation length (bytes)",
                               "test bits per byte (lower is better)",
                               "bytelm: evaluated past the training length",
                               training_length=True)),),
)
class ByteLM(Task):
    @dataclass(frozen=True)
    class Data(DataSettings):
        seq_len: int = 256  # training length
        eval_bytes: int = 65536  # bytes of a split read per evaluation length
        extrapolation: tuple[int, ...] = (1, 2, 4, 8)  # multipliers of seq_len, final test evaluation
        fractions: tuple[float, ...] = (0.9, 0.05, 0.05)  # train/val/test by position

    model_kind = "decoder_lm"
    metric = "bits_per_byte"
    higher_is_better = False
    causal_self_attention = True

    def prepare(self) -> None:
        data = enwiki.load_bytes()
        parts = enwiki.split_by_position(data, self.data.fractions)
        self.splits = {k: {"bytes": torch.from_numpy(np.ascontiguousarray(v).astype(np.int64))}
                       for k, v in parts.items()}

    @property
    def seq_len(self) -> int:
        return self.data.seq_len

    def model_overrides(self) -> dict[str, Any]:
        longest = self.seq_len * max(self.data.extrapolation)
        return {"vocab_size": 256, "max_len": longest + 8}

    def train_batch(self, step: int, batch_size: int) -> Split:
        stream = self.splits["train"]["bytes"]
        gen = np.random.default_rng([self.seed, step, 0xB17E])
        starts = torch.from_numpy(gen.integers(0, len(stream) - self.seq_len - 1, batch_size))
        offsets = torch.arange(self.seq_len + 1)
        return {"window": stream[starts[:, None] + offsets]}  # (B, L + 1)

    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        window = to_model_device(batch["window"], model)  # (B, L + 1)
        logits = model(window[:, :-1])  # (B, L, 256)
        loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        return loss, int(window[:, :-1].numel())

    @torch.no_grad()
    def bits_per_byte(self, model: nn.Module, split: str, length: int, budget: int,
                      batch_size: int) -> Metric:
        """Mean bits per byte over ``length``-byte windows covering the first ``budget`` bytes, each read alone."""
        stream = self.splits[split]["bytes"]
        count = max(1, min(budget, len(stream) - 1) // length)
        windows = stream[: count * length + 1].unfold(0, length + 1, length)  # (W, length + 1)
        total, predicted = 0.0, 0
        start = time.perf_counter()
        for first in range(0, len(windows), batch_size):
            chunk = to_model_device(windows[first:first + batch_size], model)  # (b, length + 1)
            logits = model(chunk[:, :-1])  # (b, length, 256)
            nats = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
            total += float(nats)
            predicted += chunk[:, 1:].numel()
        return Metric("bits_per_byte", total / predicted / LN2, "", predicted,
                      time.perf_counter() - start)

    def evaluate(self, model: nn.Module, split: str, *, limit: int | None, batch_size: int,
                 final: bool) -> list[Metric]:
        budget = self.data.eval_bytes
        metrics = [self.bits_per_byte(model, split, self.seq_len, budget, batch_size)]
        if final:
            for factor in self.data.extrapolation:
                length = self.seq_len * factor
                m = self.bits_per_byte(model, split, length, budget, max(1, batch_size // factor))
                metrics.append(Metric(m.name, m.value, f"length={length}", m.tokens, m.seconds))
        return metrics
