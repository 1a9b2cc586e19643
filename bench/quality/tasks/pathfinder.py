"""``pathfinder``: are the two dots joined by one dashed curve? Generated images (two dots,
curved dashed paths, distractor paths), read as a sequence of pixel tokens."""

from __future__ import annotations

import numpy as np

from bench.data import pathfinder
from bench.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, as_tensors


def patch_codes(images: np.ndarray, patch: int) -> np.ndarray:
    """Binary ``patch x patch`` blocks of ``images (n, S, S)`` as token ids ``(n, (S/patch)^2)``:
    bit ``k`` of a block's id is pixel ``k`` (row-major) lit (> 127). Lossless for Pathfinder
    (black background, white paths and dots)."""
    n, size = images.shape[0], images.shape[1]
    side = size // patch
    blocks = (images[:, : side * patch, : side * patch] > 127).reshape(n, side, patch, side, patch)
    bits = blocks.transpose(0, 1, 3, 2, 4).reshape(n, side * side, patch * patch)  # (n, L, p*p)
    return (bits * (1 << np.arange(patch * patch))).sum(axis=-1).astype(np.int64)


class Pathfinder(ClassificationTask):
    """Data settings: ``size`` (image side), ``patch`` (default 1: each pixel is a token,
    grey level = id, ``seq_len = size**2``; 2: each binary 2x2 block is a token, 16 ids,
    ``seq_len = (size/2)**2``), ``examples`` (split 80/10/10), ``data_seed``, and any
    generator parameter (``num_distractors``, ``path_length``, ``dash``, ``gap``, ...).
    Images are cached outside git."""

    name = "pathfinder"
    num_classes = 2
    vocab_size = 256

    def prepare(self) -> None:
        params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.data.items()
                  if k not in ("examples", "data_seed", "fractions", "patch")}
        seed = int(self.data.get("data_seed", 0))
        images, labels = pathfinder.load_or_generate(int(self.data["examples"]), seed=seed, **params)
        patch = int(self.data.get("patch", 1))
        if patch > 1:
            self.vocab_size = 1 << (patch * patch)
            ids = patch_codes(images, patch)
        else:
            ids = images.reshape(len(images), -1)
        arrays = {"ids": ids, "labels": labels}
        parts = split_indices(len(labels), seed=seed, stratify=labels)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}
