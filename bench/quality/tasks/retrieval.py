"""``retrieval``: do two BBC News articles share a category? A dual encoder classifies fixed pairs drawn inside a
split, half positive. ``train_pairing: in_batch`` trains on every pair of a batch's articles, each class half
of the loss (``fixed``: on ``train_pairs`` fixed pairs); ``train_crop_from: L`` reads a training article as a
``seq_len``-byte window at a per-step offset inside its first ``L`` bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.validation import require_choice, require_int
from bench.quality.data import bbc
from bench.quality.tasks.base import Split, to_model_device
from bench.quality.tasks.registration import register_task
from bench.quality.tasks.text import ArticleTask

PRESETS = {
    "tiny": {
        "data": {"seq_len": 32, "train_pairs": 64, "val_pairs": 16, "test_pairs": 32,
                 "data_seed": 0},
    },
    "small": {
        "note": ("256 bytes per article; in-batch pairs (all 120 pairs of 16 articles per step); "
                 "a pair is scored by the cosine of its two encodings (LRA's concat MLP head "
                 "stayed within 5 points of chance at this budget)."),
        "data": {"seq_len": 256, "train_pairing": "in_batch", "val_pairs": 400, "test_pairs": 800,
                 "data_seed": 0, "dedupe": "near"},
        "model": {"pair_head": "cosine"},
        "train": {"steps": 600, "batch_size": 16, "eval_every": 150},
    },
    # lra: lra_benchmarks/matching/configs/base_match_config.py: max_length 4000 per document,
    # emb 128, 4 heads, 4 layers, mlp 512, batch 32, 5,000 steps
    "lra": {
        "data": {"seq_len": 4000, "train_pairs": 100000, "val_pairs": 2000, "test_pairs": 4000,
                 "data_seed": 0, "dedupe": "near"},
        "model": {"d_model": 128, "num_heads": 4, "num_layers": 4, "d_ff": 512, "head_hidden": 512},
        "train": {"warmup_steps": 1000, "lr": 0.00056},
    },
}


@register_task("retrieval", order=3, presets=PRESETS)
class Retrieval(ArticleTask):
    """Labels are balanced (same category or not)."""

    @dataclass(frozen=True)
    class Data(ArticleTask.Data):
        train_pairing: str = "in_batch"  # or "fixed"
        train_pairs: int = 10000  # fixed only
        val_pairs: int = 400
        test_pairs: int = 800
        train_crop_from: int | None = None  # in_batch only (module docstring)

    num_classes = 2

    def prepare(self) -> None:
        texts, keep, arrays, parts = self.article_splits()
        ids, key_mask, labels = arrays["ids"], arrays["key_mask"], arrays["labels"]
        seed = self.data.data_seed
        articles = np.asarray(parts["train"])
        self.articles = {"ids": torch.from_numpy(ids[articles]),
                         "key_mask": torch.from_numpy(key_mask[articles]),
                         "category": torch.from_numpy(labels[articles].astype(np.int64))}
        if self.crop_from:
            texts = [texts[row] for row in keep[articles]]  # the training articles, in order
            long_ids, long_mask = bbc.encode_bytes(texts, self.crop_from)
            self.long_articles = (torch.from_numpy(long_ids), torch.from_numpy(long_mask.sum(axis=1)))
        for offset, (split, index) in enumerate(parts.items()):
            if split == "train" and self.in_batch:
                self.splits[split] = {"labels": torch.zeros(1, dtype=torch.int64)}  # unused
                continue
            a, b, same = bbc.make_pairs(labels, np.asarray(index), getattr(self.data, f"{split}_pairs"),
                                        seed=seed * 3 + offset)
            self.splits[split] = {
                "ids": torch.from_numpy(ids[a]), "key_mask": torch.from_numpy(key_mask[a]),
                "pair_ids": torch.from_numpy(ids[b]), "pair_key_mask": torch.from_numpy(key_mask[b]),
                "labels": torch.from_numpy(same.astype(np.int64)),
            }

    @property
    def in_batch(self) -> bool:
        pairing = self.data.train_pairing
        require_choice("retrieval: data setting 'train_pairing'", pairing, ("in_batch", "fixed"))
        return pairing == "in_batch"

    @property
    def crop_from(self) -> int:
        value = self.data.train_crop_from
        if value is None:
            return 0
        require_int("retrieval: data setting 'train_crop_from'", value, minimum=self.seq_len)
        if not self.in_batch:
            raise ValueError("retrieval: data setting 'train_crop_from' needs train_pairing 'in_batch'")
        return value

    @property
    def seq_len(self) -> int:
        return self.data.seq_len

    def model_overrides(self) -> dict[str, Any]:
        return {**super().model_overrides(), "dual": True}

    def train_batch(self, step: int, batch_size: int) -> Split:
        if not self.in_batch:
            return super().train_batch(step, batch_size)
        gen = np.random.default_rng([self.seed, step, 0x7A5C])
        index = torch.from_numpy(gen.choice(len(self.articles["category"]), batch_size,
                                            replace=False))
        batch = {k: v[index] for k, v in self.articles.items()}
        if self.crop_from:
            long_ids, lengths = (t[index] for t in self.long_articles)  # (B, L), (B,)
            room = (lengths - self.seq_len).clamp(min=0).numpy()  # (B,)
            start = torch.from_numpy(np.floor(gen.random(batch_size) * (room + 1)).astype(np.int64))
            offsets = start[:, None] + torch.arange(self.seq_len)  # (B, N)
            batch["ids"] = long_ids.gather(1, offsets)  # (B, N)
            batch["key_mask"] = offsets < lengths[:, None]  # (B, N)
        return batch

    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        if "category" not in batch:
            return super().loss(model, batch)
        batch = to_model_device(batch, model)
        u = model.embed(batch["ids"], batch["key_mask"])  # (B, D)
        first, second = torch.triu_indices(len(u), len(u), offset=1, device=u.device)  # (P,)
        a, b = u[first], u[second]  # (P, D)
        logits = model.pair_logits(a, b)  # (P, 2)
        same = (batch["category"][first] == batch["category"][second]).long()  # (P,)
        weight = torch.where(same.bool(), 0.5 / same.sum().clamp(min=1),
                             0.5 / (1 - same).sum().clamp(min=1))
        loss = (F.cross_entropy(logits, same, reduction="none") * weight).sum()
        return loss, int(batch["key_mask"].sum())

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        batch = to_model_device(batch, model)
        return model(batch["ids"], batch["key_mask"], pair_ids=batch["pair_ids"],
                     pair_key_mask=batch["pair_key_mask"])  # (B, 2)

    def batch_tokens(self, batch: Split) -> int:
        return int(batch["key_mask"].sum() + batch["pair_key_mask"].sum())
