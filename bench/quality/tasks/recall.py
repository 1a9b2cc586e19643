"""``recall``: associative recall at controlled distances, accuracy overall and per distance (docs/quality.md,
"Recall")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from bench.quality.data import recall
from bench.quality.tasks.base import ClassificationTask, GeneratedTask, Metric, SplitSizes
from bench.quality.tasks.registration import ConditionFigure, ConditionView, register_task

PRESETS = {
    "tiny": {
        "data": {"seq_len": 32, "distances": [4, 8, 16], "num_keys": 8, "num_values": 4,
                 "num_pairs": 2, "num_fillers": 8, "pair_gap": 2, "train_examples": 128,
                 "val_examples": 32, "test_examples": 48, "data_seed": 0},
    },
    "small": {
        "note": ("distances 8..192 on 256 tokens; each value 2 tokens before its key, so dilation "
                 "2 can bind the pair (adjacent, it never can); by the mask, two layers of window "
                 "16 answer up to d = 30, of dilation-2 window 16 every even d up to 62 "
                 "(bench/quality/reach.py)."),
        "data": {"seq_len": 256, "distances": [8, 16, 32, 64, 128, 192], "num_keys": 16,
                 "num_values": 8, "num_pairs": 4, "num_fillers": 16, "pair_gap": 2,
                 "train_examples": 6000, "val_examples": 600, "test_examples": 1200, "data_seed": 0},
    },
    "lra": {
        "data": {"seq_len": 4096, "distances": [16, 64, 256, 1024, 2048, 4000], "num_keys": 64,
                 "num_values": 16, "num_pairs": 16, "num_fillers": 64, "pair_gap": 2,
                 "train_examples": 100000, "val_examples": 2000, "test_examples": 6000,
                 "data_seed": 0},
    },
}


@register_task(
    "recall",
    order=9,
    presets=PRESETS,
    conditions=(ConditionView(
        "accuracy", "distance=", "Recall accuracy by distance (test)",
        figure=ConditionFigure(
            "recall_distance", "distance from the query back to its key (tokens)",
            "test accuracy",
            "recall: dotted, the largest distance each variant's mask lets the bound\n"
            "(key, value) pair reach the query in the model's layers (no line: all shown)",
            reach=True)),),
)
class Recall(GeneratedTask, ClassificationTask):
    """The classifier reads the last position (``pooling="last"``)."""

    @dataclass(frozen=True)
    class Data(SplitSizes):
        seq_len: int = 256
        distances: tuple[int, ...] = (8, 16, 32, 64, 128, 192)
        num_keys: int = 16
        num_values: int = 8
        num_pairs: int = 4
        num_fillers: int = 16
        pair_gap: int | tuple[int, ...] = 1  # tokens from a value to its key (a list: drawn per pair)

    pooling = "last"

    def __init__(self, data: dict[str, object], seed: int) -> None:
        super().__init__(data, seed)
        d = self.data  # classes known before prepare: uniform chance
        self.num_classes, self.vocab_size = d.num_values, recall.vocab_size(d.num_keys, d.num_values, d.num_fillers)

    def generate(self, count: int, seed: int) -> dict[str, np.ndarray]:
        d = self.data
        arrays = recall.generate(count, seq_len=d.seq_len, distances=d.distances, seed=seed,
                                 pair_gap=d.pair_gap, num_keys=d.num_keys, num_values=d.num_values,
                                 num_pairs=d.num_pairs, num_fillers=d.num_fillers)
        return {k: arrays[k] for k in ("ids", "labels", "distance")}

    def condition_metrics(self, split: str, preds: Tensor, labels: Tensor) -> list[Metric]:
        """Accuracy at each key-query distance (``distance=d``)."""
        return self.accuracy_by("distance=", self.splits[split]["distance"][: len(labels)], (preds == labels).float())
