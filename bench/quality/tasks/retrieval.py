"""``retrieval``: do two BBC News articles share a category? A dual encoder reads both
(byte level, ``seq_len`` bytes each) and classifies the pair, as in LRA's document retrieval.
Pairs are drawn inside one split only: no test article is ever seen in training."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench.data import bbc
from bench.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, Split


class Retrieval(ClassificationTask):
    """Data settings: ``seq_len`` (bytes per article), ``train_pairs``, ``val_pairs``,
    ``test_pairs``, ``data_seed``. Labels are balanced (same category or not)."""

    name = "retrieval"
    num_classes = 2
    vocab_size = 257

    def prepare(self) -> None:
        texts, labels = bbc.load_articles()
        ids, key_mask = bbc.encode_bytes(texts, int(self.data["seq_len"]))
        seed = int(self.data.get("data_seed", 0))
        parts = split_indices(len(labels), seed=seed, stratify=labels)
        for offset, (split, index) in enumerate(parts.items()):
            a, b, same = bbc.make_pairs(labels, np.asarray(index), int(self.data[f"{split}_pairs"]),
                                        seed=seed * 3 + offset)
            self.splits[split] = {
                "ids": torch.from_numpy(ids[a]), "key_mask": torch.from_numpy(key_mask[a]),
                "pair_ids": torch.from_numpy(ids[b]), "pair_key_mask": torch.from_numpy(key_mask[b]),
                "labels": torch.from_numpy(same.astype(np.int64)),
            }

    def model_overrides(self) -> dict[str, Any]:
        return {**super().model_overrides(), "dual": True}

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        return model(batch["ids"], batch["key_mask"], pair_ids=batch["pair_ids"],
                     pair_key_mask=batch["pair_key_mask"])  # (B, 2)

    def batch_tokens(self, batch: Split) -> int:
        return int(batch["key_mask"].sum() + batch["pair_key_mask"].sum())
