"""``listops``: 10-way classification of nested list expressions generated with the Long Range Arena algorithm."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.quality.data import listops
from bench.quality.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, DataSettings, as_tensors
from bench.quality.tasks.registration import register_task

PRESETS = {
    "tiny": {
        "data": {"seq_len": 64, "examples": 200, "max_depth": 3, "max_args": 4, "min_length": 8,
                 "data_seed": 0},
    },
    "small": {
        "note": "LRA's generator and operators; 256 tokens instead of 2,000, depth 6, 8 arguments.",
        "data": {"seq_len": 256, "examples": 6000, "max_depth": 6, "max_args": 8, "min_length": 96,
                 "data_seed": 0},
    },
    # lra: lra_benchmarks/listops/configs/base_listops_config.py: max_length 2000, emb 512,
    # 8 heads, 6 layers, mlp 2048, batch 32, 5,000 steps, warm-up 1,000
    "lra": {
        "data": {"seq_len": 2000, "examples": 100000, "max_depth": 10, "max_args": 10,
                 "min_length": 500, "data_seed": 0, "fractions": [0.96, 0.02, 0.02]},
        "model": {"d_model": 512, "num_heads": 8, "num_layers": 6, "d_ff": 2048},
    },
}


@register_task("listops", order=1, presets=PRESETS)
class ListOps(ClassificationTask):
    @dataclass(frozen=True)
    class Data(DataSettings):
        seq_len: int = 2000
        examples: int = 100000  # train + val + test, split by fractions
        max_depth: int = 10
        max_args: int = 10
        min_length: int = 0
        data_seed: int = 0
        fractions: tuple[float, ...] = (0.8, 0.1, 0.1)

    num_classes = 10
    vocab_size = len(listops.VOCAB)

    def prepare(self) -> None:
        d = self.data
        ids, key_mask, labels = listops.load_or_generate(
            d.examples, seed=d.data_seed, seq_len=d.seq_len, max_depth=d.max_depth, max_args=d.max_args,
            min_length=d.min_length, max_length=d.seq_len)
        arrays = {"ids": ids, "key_mask": key_mask, "labels": labels}
        parts = split_indices(len(labels), seed=d.data_seed, fractions=d.fractions)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
