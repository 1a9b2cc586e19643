"""``pathfinder``: are the two dots joined by one dashed curve? Generated images (two dots,
curved dashed paths, distractor paths), read as a sequence of pixel tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor, nn

from attn.validation import require_choice
from bench.quality.data import pathfinder
from bench.quality.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, PatchedImageTask, Split, as_tensors
from bench.quality.tasks.registration import register_task

INPUTS = ("pixels", "patches")


def patch_codes(images: np.ndarray, patch: int) -> np.ndarray:
    """Binary ``patch x patch`` blocks of ``images (n, S, S)`` as token ids ``(n, (S/patch)^2)``:
    bit ``k`` of a block's id is pixel ``k`` (row-major) lit (> 127). Lossless for Pathfinder
    (black background, white paths and dots)."""
    n, size = images.shape[0], images.shape[1]
    side = size // patch
    blocks = (images[:, : side * patch, : side * patch] > 127).reshape(n, side, patch, side, patch)
    bits = blocks.transpose(0, 1, 3, 2, 4).reshape(n, side * side, patch * patch)  # (n, L, p*p)
    return (bits * (1 << np.arange(patch * patch))).sum(axis=-1).astype(np.int64)


#: the task's settings in each task preset (over the preset file's defaults)
PRESETS = {
    "tiny": {
        "data": {"size": 16, "examples": 120, "data_seed": 0},
    },
    "small": {
        "note": ("24x24 images read as 144 tokens, each a binary 2x2 block (LRA: 32x32, 1,024 "
                 "pixel tokens); solid paths of 6-9 steps and no distractor paths (LRA: dashed, "
                 "with distractors); 12,000 images, 3,600 steps. Pixel tokens, dashes or "
                 "distractors stayed at chance for every variant at this budget (docs/quality.md "
                 "lists what was tried)."),
        "data": {"size": 24, "patch": 2, "num_distractors": 0, "path_length": [6, 9], "gap": 0,
                 "examples": 12000, "data_seed": 0},
        "train": {"steps": 3600, "eval_every": 300},
    },
    # lra: lra_benchmarks/image/configs/pathfinder32/base_pathfinder32_config.py: 32x32, emb 32,
    # 2 heads, 1 layer, mlp 32, batch 512, 200 epochs of 160,000, lr 1e-3
    "lra": {
        "data": {"size": 32, "examples": 200000, "data_seed": 0, "fractions": [0.8, 0.1, 0.1]},
        "model": {"d_model": 32, "num_heads": 2, "num_layers": 1, "d_ff": 32},
        "train": {"steps": 62500, "batch_size": 512, "lr": 0.001, "weight_decay": 0.0,
                  "warmup_steps": 312, "eval_every": 3125, "checkpoint_every": 3125},
    },
}


@register_task(
    "pathfinder",
    order=6,
    presets=PRESETS,
)
class Pathfinder(PatchedImageTask):
    """Data settings: ``size`` (image side), ``input`` (how the model reads an image),
    ``examples`` (split 80/10/10), ``data_seed``, and any generator parameter
    (``num_distractors``, ``path_length``, ``dash``, ``gap``, ...). Images are cached outside git.

    ``input``: ``pixels`` (default; ``encoder_classifier``): each pixel is a token, grey level =
    id, ``seq_len = size**2``, or with ``patch: 2`` each binary 2x2 block is a token (16 ids,
    ``seq_len = (size/2)**2``); ``patches`` (``vit``): the image scaled to [0, 1] is cut into
    ``patch_size`` x ``patch_size`` patches (default 4), each linearly embedded, as the
    ``image_vit`` task reads Fashion-MNIST; ``seq_len = (size/patch_size)**2``."""

    num_classes = 2
    vocab_size = 256

    @property
    def input(self) -> str:
        kind = self.data.get("input", "pixels")
        return str(require_choice("pathfinder: data setting 'input'", kind, INPUTS))

    @property
    def model_kind(self) -> str:  # type: ignore[override]
        return "vit" if self.input == "patches" else "encoder_classifier"

    @property
    def size(self) -> int:
        return int(self.data["size"])

    def prepare(self) -> None:
        params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.data.items()
                  if k not in ("examples", "data_seed", "fractions", "patch", "input", "patch_size")}
        seed = int(self.data.get("data_seed", 0))
        images, labels = pathfinder.load_or_generate(int(self.data["examples"]), seed=seed, **params)
        patch = int(self.data.get("patch", 1))
        if self.input == "patches":
            arrays = {"images": images[:, None].astype(np.float32) / 255.0}  # (n, 1, S, S)
        elif patch > 1:
            self.vocab_size = 1 << (patch * patch)
            arrays = {"ids": patch_codes(images, patch)}
        else:
            arrays = {"ids": images.reshape(len(images), -1)}
        arrays["labels"] = labels
        parts = split_indices(len(labels), seed=seed, stratify=labels)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}

    # pixels: a sequence of pixel tokens (ClassificationTask); patches: the vit input
    @property
    def image_size(self) -> int:
        return self.size

    def model_overrides(self) -> dict[str, Any]:
        if self.input == "pixels":
            return ClassificationTask.model_overrides(self)
        return super().model_overrides()

    @property
    def seq_len(self) -> int:
        if self.input == "pixels":
            return ClassificationTask.seq_len.fget(self)
        return super().seq_len

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        if self.input == "pixels":
            return ClassificationTask.logits(self, model, batch)
        return super().logits(model, batch)

    def batch_tokens(self, batch: Split) -> int:
        if self.input == "pixels":
            return ClassificationTask.batch_tokens(self, batch)
        return super().batch_tokens(batch)
