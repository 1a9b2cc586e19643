"""``mqar``: multi-query associative recall (Arora et al. 2023, "Zoology"). Each sequence
writes ``P`` key-value pairs and then queries every key once more; the model answers at each
query position with the value bound to that key. Accuracy is over all queries, and per number
of pairs and per query-to-key distance bucket, so a window that cannot reach a pair, or a
low-rank approximation that blurs many pairs together, shows where it fails."""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.validation import invalid, require_int_list
from bench.quality.data import mqar
from bench.quality.tasks.base import ClassificationTask, Metric, Split, as_tensors, to_model_device
from bench.quality.tasks.registration import register_task

DEFAULT_BUCKETS = (16, 32, 64, 128)
#: what reads a sequence: its model kind (``reader`` setting; see :class:`MQAR`)
READERS = {"encoder": "encoder_classifier", "decoder": "decoder_lm"}


#: the task's settings in each task preset (over the preset file's defaults)
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


@register_task(
    "mqar",
    order=10,
    presets=PRESETS,
)
class MQAR(ClassificationTask):
    """Data settings: ``seq_len``, ``num_pairs`` (list, balanced over examples), ``num_keys``,
    ``num_values``, ``num_fillers``, ``distance_buckets`` (list of increasing upper edges,
    default ``[16, 32, 64, 128]``), ``train_examples``, ``val_examples``, ``test_examples``,
    ``data_seed``, ``reader``. The loss and the metrics count query positions only (labels
    ``-100`` elsewhere).

    ``reader``: ``encoder`` (default) is the encoder classifier reading every position
    (``pooling="tokens"``), bidirectional; ``decoder`` is the causal language model of Zoology
    (``decoder_lm``), whose logits at a query position, over the value tokens, are its answer.
    Nothing after a query tells its answer, so both readers solve the same task; on a decoder
    every self-attention is causal, so ``full`` and ``causal`` are one model and a variant with
    no causal form (Nystrom) is unsupported.

    Final metrics: ``accuracy`` over all queries (the headline), ``majority_accuracy`` (always
    the most frequent training value: about ``1 / num_values``), ``accuracy`` per
    ``num_pairs=P`` and per distance bucket ``distance<=E``: the queries whose distance lies in
    ``(previous edge, E]``, the last bucket ending at ``seq_len - 1``."""

    pooling = "tokens"

    def __init__(self, data: dict[str, object], seed: int) -> None:
        super().__init__(data, seed)
        self.num_classes = self._layout()["num_values"]  # known before prepare: uniform chance

    @property
    def reader(self) -> str:
        reader = self.data.get("reader", "encoder")
        if reader not in READERS:
            raise invalid("reader", f"unknown value {reader!r}; allowed values are {list(READERS)}")
        return str(reader)

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
        base = mqar.Layout(**self._layout()).value_base
        return model(ids)[..., base:base + self.num_classes]  # (B, N, C): the value tokens

    def _layout(self) -> dict[str, int]:
        d = self.data
        return {"num_keys": int(d.get("num_keys", 64)), "num_values": int(d.get("num_values", 64)),
                "num_fillers": int(d.get("num_fillers", 16))}

    def buckets(self) -> tuple[int, ...]:
        """Upper edges of the distance buckets, the last one ``seq_len - 1``."""
        edges = require_int_list("distance_buckets", self.data.get("distance_buckets", DEFAULT_BUCKETS))
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise invalid("distance_buckets", f"must be increasing; got {list(edges)}")
        top = self.seq_len - 1
        return (*(e for e in edges if e < top), top)

    def prepare(self) -> None:
        d, layout = self.data, self._layout()
        self.vocab_size = mqar.vocab_size(**layout)
        base = int(d.get("data_seed", 0))
        for offset, split in enumerate(("train", "val", "test")):
            arrays = mqar.generate(int(d[f"{split}_examples"]), seq_len=int(d["seq_len"]),
                                   num_pairs=d["num_pairs"], seed=base * 3 + offset, **layout)
            self.splits[split] = as_tensors(arrays, np.arange(len(arrays["ids"])))
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
        """Per query of the first ``limit`` examples: ``pred``, ``label``, ``num_pairs``,
        ``distance`` (1-D tensors of one length); tokens read; seconds."""
        parts: dict[str, list[Tensor]] = {"pred": [], "label": [], "num_pairs": [], "distance": []}
        tokens, start = 0, time.perf_counter()
        for batch in self.batches(split, batch_size, limit):
            query = batch["labels"] != mqar.IGNORE  # (B, N)
            pred = self.logits(model, batch).argmax(dim=-1).cpu()  # (B, N)
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
        """Accuracy per ``num_pairs=P`` and per distance bucket, from per-query ``hit``
        (1/0, or a probability of being right) and the queries' ``num_pairs`` and
        ``distance`` (as :meth:`query_predictions` gives them)."""
        metrics = []
        for pairs in torch.unique(q["num_pairs"]).tolist():
            sel = q["num_pairs"] == pairs
            metrics.append(Metric("accuracy", float(hit[sel].mean()), f"num_pairs={pairs}"))
        low = 0
        for edge in self.buckets():
            sel = (q["distance"] > low) & (q["distance"] <= edge)
            if bool(sel.any()):
                metrics.append(Metric("accuracy", float(hit[sel].mean()), f"distance<={edge}"))
            low = edge
        return metrics

    def present_value_guess(self, split: str) -> list[Metric]:
        """What answering each query with one of the values its sequence holds, drawn
        uniformly, scores in expectation (exactly, not sampled): the accuracy of a model that
        learned which values are present but not which key each belongs to (``1 / P`` when
        the values are distinct). The headline ``accuracy`` and the per-condition rows."""
        data = self.splits[split]
        query = data["labels"] != mqar.IGNORE  # (n, N)
        rows = torch.nonzero(query)[:, 0]  # (Q,): each query's example
        pairs = data["num_pairs"]  # (n,)
        base = mqar.Layout(**self._layout()).value_base
        values = data["ids"][:, 1:2 * int(pairs.max()):2] - base  # (n, max P): value slots
        written = torch.arange(values.shape[1])[None, :] < pairs[:, None]  # (n, max P)
        same = (values[rows] == data["labels"][query][:, None]) & written[rows]  # (Q, max P)
        hit = same.sum(dim=1) / pairs[rows]  # (Q,)
        q = {"num_pairs": pairs[rows], "distance": data["distance"][query]}
        return [Metric("accuracy", float(hit.mean())), *self.query_condition_metrics(q, hit.double())]
