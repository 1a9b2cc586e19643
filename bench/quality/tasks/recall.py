"""``recall``: associative recall at controlled distances. The last token queries a key
written ``d`` tokens earlier; the answer is the value stored ``pair_gap`` tokens before that key.
Accuracy is reported overall and per distance, so a pattern that cannot bring the pair to the
last position (``bench/quality/reach.py``) shows as chance there."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from bench.quality.data import recall
from bench.quality.tasks.base import ClassificationTask, Metric, as_tensors
from bench.quality.tasks.registration import ConditionFigure, ConditionView, register_task

#: the task's settings in each task preset (over the preset file's defaults)
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
class Recall(ClassificationTask):
    """Data settings: ``seq_len``, ``distances`` (list), ``num_keys``, ``num_values``,
    ``num_pairs``, ``num_fillers``, ``pair_gap`` (an integer >= 1 or a list to draw from per
    pair; default 1, the value right before its key), ``train_examples``, ``val_examples``,
    ``test_examples``, ``data_seed``. The classifier reads the last position
    (``pooling="last"``)."""

    pooling = "last"

    def __init__(self, data: dict[str, object], seed: int) -> None:
        super().__init__(data, seed)
        self.num_classes = self._layout()["num_values"]  # known before prepare: uniform chance

    def _layout(self) -> dict[str, int]:
        d = self.data
        return {"num_keys": int(d.get("num_keys", 16)), "num_values": int(d.get("num_values", 8)),
                "num_pairs": int(d.get("num_pairs", 4)), "num_fillers": int(d.get("num_fillers", 16))}

    def prepare(self) -> None:
        d, layout = self.data, self._layout()
        self.vocab_size = recall.vocab_size(layout["num_keys"], layout["num_values"],
                                            layout["num_fillers"])
        base = int(d.get("data_seed", 0))
        gap = d.get("pair_gap", 1)
        gap = tuple(gap) if isinstance(gap, (list, tuple)) else gap
        for offset, split in enumerate(("train", "val", "test")):
            arrays = recall.generate(int(d[f"{split}_examples"]), seq_len=int(d["seq_len"]),
                                     distances=tuple(d["distances"]), seed=base * 3 + offset,
                                     pair_gap=gap, **layout)
            keep = {"ids": arrays["ids"], "labels": arrays["labels"], "distance": arrays["distance"]}
            self.splits[split] = as_tensors(keep, np.arange(len(arrays["labels"])))

    def condition_metrics(self, split: str, preds: Tensor, labels: Tensor) -> list[Metric]:
        """Accuracy at each key-query distance (``distance=d``)."""
        distance = self.splits[split]["distance"][: len(labels)]
        found = []
        for d in torch.unique(distance).tolist():
            hit = distance == d
            found.append(Metric("accuracy", float((preds[hit] == labels[hit]).float().mean()),
                                f"distance={d}"))
        return found
