"""``mqar``: multi-query associative recall (Arora et al. 2023, "Zoology"): ``P`` key-value
pairs, then every key queried once more (docs/quality.md, "MQAR")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.validation import require_choice
from bench.quality.data import mqar
from bench.quality.tasks.base import ClassificationTask, GeneratedTask, Metric, Split, SplitSizes, to_model_device
from bench.quality.tasks.registration import register_task

#: what reads a sequence: its model kind (``reader`` setting; see :class:`MQAR`)
READERS = {"encoder": "encoder_classifier", "decoder": "decoder_lm"}


PRESETS = {
    "tiny": {
        "note": "2 or 4 pairs on 48 tokens; checks the pipeline (per-token logits, conditions).",
        "data": {"seq_len": 48, "num_pairs": [2, 4], "num_keys": 8, "num_values": 8,
                 "num_fillers": 4, "distance_buckets": [8, 16], "train_examples": 128,
                 "val_examples": 32, "test_examples": 48, "data_seed": 0},
    },
    "small": {
        "note": ("4-16 pairs of 32 keys and 32 values on 256 tokens, read by a decoder as in "
                 "Zoology, its output layer not tied to the embedding (a bidirectional encoder, "
                 "or tied embeddings, do not learn the recall at this budget; docs/quality.md)."),
        "data": {"seq_len": 256, "num_pairs": [4, 8, 16], "num_keys": 32, "num_values": 32,
                 "num_fillers": 16, "distance_buckets": [16, 32, 64, 128], "train_examples": 8000,
                 "val_examples": 400, "test_examples": 1000, "data_seed": 0, "reader": "decoder"},
        "model": {"tie_embeddings": False},
        "train": {"steps": 1200, "lr": 0.003, "eval_every": 200, "eval_examples": 200},
    },
    "lra": {
        "note": ("MQAR (Arora et al. 2023, \"Zoology\") at 1,024 tokens with up to 128 pairs; not "
                 "an LRA task, sized like them. Not run yet (a GPU setting)."),
        "data": {"seq_len": 1024, "num_pairs": [8, 16, 32, 64, 128], "num_keys": 256,
                 "num_values": 256, "num_fillers": 64, "distance_buckets": [16, 64, 128, 256, 512],
                 "train_examples": 100000, "val_examples": 2000, "test_examples": 4000,
                 "data_seed": 0},
    },
}


@register_task("mqar", order=10, presets=PRESETS)
class MQAR(GeneratedTask, ClassificationTask):
    """Loss and metrics on query positions only, read by the encoder classifier (``pooling="tokens"``) or
    Zoology's causal ``decoder_lm`` (its logits over the value tokens)."""

    @dataclass(frozen=True)
    class Data(SplitSizes):
        seq_len: int = 256
        num_pairs: int | tuple[int, ...] = (4, 8, 16)  # balanced over examples
        num_keys: int = 64
        num_values: int = 64
        num_fillers: int = 16
        distance_buckets: tuple[int, ...] = (16, 32, 64, 128)  # increasing upper edges
        reader: str = "encoder"

    pooling = "tokens"

    def __init__(self, data: dict[str, object], seed: int) -> None:
        super().__init__(data, seed)
        d = self.data  # classes known before prepare: uniform chance
        self.layout = mqar.Layout(d.num_keys, d.num_values, d.num_fillers)
        self.num_classes, self.vocab_size = d.num_values, self.layout.vocab_size

    @property
    def reader(self) -> str:
        return require_choice("reader", self.data.reader, READERS)

    @property
    def model_kind(self) -> str:  # type: ignore[override]
        return READERS[self.reader]

    @property
    def causal_self_attention(self) -> bool:  # type: ignore[override]
        return self.reader == "decoder"

    def model_overrides(self) -> dict[str, Any]:
        if self.reader == "encoder":
            return super().model_overrides()
        return {"vocab_size": self.vocab_size, "max_len": self.seq_len + 8}

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        if self.reader == "encoder":
            return super().logits(model, batch)  # (B, N, C)
        ids = to_model_device(batch["ids"], model)
        base = self.layout.value_base
        return model(ids)[..., base:base + self.num_classes]  # (B, N, C): the value tokens

    def buckets(self) -> tuple[int, ...]:
        """Upper edges of the distance buckets, the last one ``seq_len - 1``."""
        return self.bucket_edges("distance_buckets", self.seq_len - 1)

    def generate(self, count: int, seed: int) -> dict[str, np.ndarray]:
        d = self.data
        return mqar.generate(count, seq_len=d.seq_len, num_pairs=d.num_pairs, seed=seed,
                             num_keys=d.num_keys, num_values=d.num_values, num_fillers=d.num_fillers)

    def prepare(self) -> None:
        super().prepare()
        self.buckets()  # check the edges before training starts

    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        batch = to_model_device(batch, model)
        logits = self.logits(model, batch)  # (B, N, C)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                               ignore_index=mqar.IGNORE)
        return loss, self.batch_tokens(batch)

    @torch.no_grad()
    def query_predictions(self, model: nn.Module, split: str, limit: int | None,
                          batch_size: int) -> tuple[dict[str, Tensor], int, float]:
        """Each query's ``pred``, ``label``, ``num_pairs``, ``distance`` (first ``limit`` examples); tokens, seconds."""
        parts: dict[str, list[Tensor]] = {"pred": [], "label": [], "num_pairs": [], "distance": []}
        tokens, start = 0, time.perf_counter()
        for batch in self.batches(split, batch_size, limit):
            query = batch["labels"] != mqar.IGNORE  # (B, N)
            pred = self.eval_logits(model, batch, batch_size).argmax(dim=-1).cpu()  # (B, N)
            parts["pred"].append(pred[query])
            parts["label"].append(batch["labels"][query])
            parts["num_pairs"].append(batch["num_pairs"][:, None].expand_as(query)[query])
            parts["distance"].append(batch["distance"][query])
            tokens += self.batch_tokens(batch)
        out = {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.long) for k, v in parts.items()}
        return out, tokens, time.perf_counter() - start

    def majority_accuracy(self, split: str, count: int) -> Metric:
        """Accuracy of always answering the most frequent value of the training queries."""
        train = self.splits["train"]["labels"]
        common = int(torch.bincount(train[train != mqar.IGNORE]).argmax())
        labels = self.splits[split]["labels"][:count]
        labels = labels[labels != mqar.IGNORE]
        return Metric("majority_accuracy", float((labels == common).float().mean()))

    def evaluate(self, model: nn.Module, split: str, *, limit: int | None, batch_size: int,
                 final: bool) -> list[Metric]:
        q, tokens, seconds = self.query_predictions(model, split, limit, batch_size)
        hit = (q["pred"] == q["label"]).float()  # (Q,)
        accuracy = float(hit.mean()) if len(hit) else float("nan")
        metrics = [Metric("accuracy", accuracy, "", tokens, seconds)]
        if not final:
            return metrics
        count = self.num_examples(split) if limit is None else min(limit, self.num_examples(split))
        return [*metrics, self.majority_accuracy(split, count), *self.query_condition_metrics(q, hit)]

    def query_condition_metrics(self, q: dict[str, Tensor], hit: Tensor) -> list[Metric]:
        """Accuracy per ``num_pairs=P`` and per bucket ``distance<=E`` of per-query ``hit`` (1/0 or a probability)."""
        return [*self.accuracy_by("num_pairs=", q["num_pairs"], hit),
                *self.accuracy_by_bucket("distance<=", q["distance"], hit, self.buckets())]

    def present_value_guess(self, split: str) -> list[Metric]:
        """The expected accuracy (exact) of answering each query with a value its sequence holds, drawn uniformly:
        a model that learned which values are present but not their keys (``1 / P`` for distinct values)."""
        data = self.splits[split]
        query = data["labels"] != mqar.IGNORE  # (n, N)
        rows = torch.nonzero(query)[:, 0]  # (Q,): each query's example
        pairs = data["num_pairs"]  # (n,)
        base = self.layout.value_base
        values = data["ids"][:, 1:2 * int(pairs.max()):2] - base  # (n, max P): value slots
        written = torch.arange(values.shape[1])[None, :] < pairs[:, None]  # (n, max P)
        same = (values[rows] == data["labels"][query][:, None]) & written[rows]  # (Q, max P)
        hit = same.sum(dim=1) / pairs[rows]  # (Q,)
        q = {"num_pairs": pairs[rows], "distance": data["distance"][query]}
        return [Metric("accuracy", float(hit.mean())), *self.query_condition_metrics(q, hit.double())]
