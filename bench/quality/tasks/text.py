"""``text``: BBC News articles (5 categories), byte-level, classified by their first
``seq_len`` bytes."""

from __future__ import annotations

import numpy as np

from bench.data import bbc
from bench.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, as_tensors


class Text(ClassificationTask):
    """Data settings: ``seq_len`` (bytes kept from the start of each article), ``data_seed``.
    Articles whose first ``seq_len`` bytes repeat another's are kept once; splits 80/10/10,
    stratified by category."""

    name = "text"
    num_classes = len(bbc.CATEGORIES)
    vocab_size = 257  # byte value + 1, 0 = padding

    def prepare(self) -> None:
        texts, labels = bbc.load_articles()
        ids, key_mask = bbc.encode_bytes(texts, int(self.data["seq_len"]))
        keep = bbc.distinct_rows(ids)  # duplicate inputs would straddle the splits
        ids, key_mask, labels = ids[keep], key_mask[keep], labels[keep]
        arrays = {"ids": ids, "key_mask": key_mask, "labels": labels}
        parts = split_indices(len(labels), seed=int(self.data.get("data_seed", 0)),
                              stratify=labels)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
