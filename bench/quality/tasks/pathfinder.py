"""``pathfinder``: are the two dots joined by one dashed curve? Generated images (two dots,
curved dashed paths, distractor paths), read as a sequence of pixel tokens."""

from __future__ import annotations

import numpy as np

from bench.data import pathfinder
from bench.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, as_tensors


class Pathfinder(ClassificationTask):
    """Data settings: ``size`` (image side; ``seq_len = size**2``), ``examples`` (split
    80/10/10), ``data_seed``, and any generator parameter (``num_distractors``,
    ``path_length``, ``dash``, ``gap``, ...). Images are cached outside git."""

    name = "pathfinder"
    num_classes = 2
    vocab_size = 256

    def prepare(self) -> None:
        params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.data.items()
                  if k not in ("examples", "data_seed", "fractions")}
        seed = int(self.data.get("data_seed", 0))
        images, labels = pathfinder.load_or_generate(int(self.data["examples"]), seed=seed, **params)
        arrays = {"ids": images.reshape(len(images), -1), "labels": labels}
        parts = split_indices(len(labels), seed=seed, stratify=labels)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
