"""``text``: BBC News articles (5 categories), byte-level, classified by their first ``seq_len`` bytes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.quality.data import bbc
from bench.quality.tasks.base import ClassificationTask, DataSettings, as_tensors
from bench.quality.tasks.registration import register_task

PRESETS = {
    "tiny": {
        "data": {"seq_len": 64, "data_seed": 0},
    },
    "small": {
        "note": "the first 256 bytes of each article (LRA reads 1-4K bytes of IMDb reviews).",
        "data": {"seq_len": 256, "data_seed": 0, "dedupe": "near"},
        "train": {"steps": 350},
    },
    # lra: lra_benchmarks/text_classification/configs/base_tc_config.py: max_length 1000 (the
    # paper's Table 1 reports the 4K setting, used here), emb 256, 4 heads, 4 layers, mlp 1024,
    # batch 32, 20,000 steps, warm-up 8,000
    "lra": {
        "data": {"seq_len": 4000, "data_seed": 0, "dedupe": "near"},
        "train": {"steps": 20000, "warmup_steps": 8000, "lr": 0.00056},
    },
}


class ArticleTask(ClassificationTask):
    """BBC News articles read as bytes, split by :func:`bench.quality.data.bbc.split_articles`."""

    @dataclass(frozen=True)
    class Data(DataSettings):
        seq_len: int = 256  # bytes kept from the start of each article
        data_seed: int = 0
        dedupe: str = "exact"  # or "near"

    vocab_size = 257  # byte value + 1, 0 = padding

    @property
    def dedupe(self) -> str:
        return bbc.check_dedupe(f"{self.name}: data setting 'dedupe'", self.data.dedupe)

    def article_splits(self) -> tuple[list[str], np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The articles, the rows kept, their ``ids``, ``key_mask`` and ``labels``, and their splits."""
        dedupe = self.dedupe
        texts, labels = bbc.load_articles()
        ids, key_mask = bbc.encode_bytes(texts, self.data.seq_len)
        keep, parts = bbc.split_articles(texts, labels, ids, seed=self.data.data_seed, dedupe=dedupe)
        return texts, keep, {"ids": ids[keep], "key_mask": key_mask[keep], "labels": labels[keep]}, parts


@register_task("text", order=2, presets=PRESETS)
class Text(ArticleTask):
    num_classes = len(bbc.CATEGORIES)

    def prepare(self) -> None:
        _, _, arrays, parts = self.article_splits()
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
