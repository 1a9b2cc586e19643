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


class Recall(ClassificationTask):
    """Data settings: ``seq_len``, ``distances`` (list), ``num_keys``, ``num_values``,
    ``num_pairs``, ``num_fillers``, ``pair_gap`` (an integer >= 1 or a list to draw from per
    pair; default 1, the value right before its key), ``train_examples``, ``val_examples``,
    ``test_examples``, ``data_seed``. The classifier reads the last position
    (``pooling="last"``)."""

    name = "recall"
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
        self.num_classes = layout["num_values"]
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
