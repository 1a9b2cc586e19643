"""``listops``: nested MAX / MIN / MED / SUM_MOD expressions, generated with the Long Range
Arena algorithm; 10-way classification of the expression's value."""

from __future__ import annotations

import numpy as np

from bench.quality.data import listops
from bench.quality.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, as_tensors


class ListOps(ClassificationTask):
    """Data settings: ``seq_len``, ``examples`` (train + val + test, split 80/10/10 unless
    ``fractions`` is given), ``max_depth``, ``max_args``, ``min_length``, ``data_seed``."""

    name = "listops"
    num_classes = 10
    vocab_size = len(listops.VOCAB)

    def prepare(self) -> None:
        d = self.data
        seq_len = int(d["seq_len"])
        ids, key_mask, labels = listops.load_or_generate(
            int(d["examples"]), seed=int(d.get("data_seed", 0)), seq_len=seq_len,
            max_depth=int(d.get("max_depth", 10)), max_args=int(d.get("max_args", 10)),
            min_length=int(d.get("min_length", 0)), max_length=seq_len)
        arrays = {"ids": ids, "key_mask": key_mask, "labels": labels}
        parts = split_indices(len(labels), seed=int(d.get("data_seed", 0)),
                              fractions=tuple(d.get("fractions", (0.8, 0.1, 0.1))))
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
