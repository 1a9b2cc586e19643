"""``pathfinder``: are the two dots of a generated image joined by one dashed curve?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor, nn

from attn.validation import require_choice
from bench.quality.data import pathfinder
from bench.quality.data.splits import split_indices
from bench.quality.tasks.base import ClassificationTask, DataSettings, PatchedImageTask, Split, as_tensors
from bench.quality.tasks.registration import register_task

INPUTS = ("pixels", "patches")


def patch_codes(images: np.ndarray, patch: int) -> np.ndarray:
    """Binary ``patch x patch`` blocks of ``images (n, S, S)`` as ids ``(n, (S/patch)^2)``: bit ``k`` is pixel ``k``
    (row-major) lit (> 127), lossless for Pathfinder's black and white."""
    n, size = images.shape[0], images.shape[1]
    side = size // patch
    blocks = (images[:, : side * patch, : side * patch] > 127).reshape(n, side, patch, side, patch)
    bits = blocks.transpose(0, 1, 3, 2, 4).reshape(n, side * side, patch * patch)  # (n, L, p*p)
    return (bits * (1 << np.arange(patch * patch))).sum(axis=-1).astype(np.int64)


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


@register_task("pathfinder", order=6, presets=PRESETS)
class Pathfinder(PatchedImageTask):
    """``input``: ``pixels`` (``encoder_classifier``): a token per pixel, or with ``patch: 2`` per binary 2x2 block;
    ``patches`` (``vit``): the image cut into ``patch_size`` patches, as ``image_vit`` reads Fashion-MNIST."""

    @dataclass(frozen=True)
    class Data(DataSettings):
        size: int = 32  # image side
        examples: int = 200000  # split 80/10/10 (fractions), stratified by label
        data_seed: int = 0
        fractions: tuple[float, ...] = (0.8, 0.1, 0.1)
        input: str = "pixels"  # or "patches": how the model reads an image
        patch: int = 1
        patch_size: int = 4
        # the generator's parameters (bench/quality/data/pathfinder.py; None: its default at size)
        num_distractors: int | None = None
        path_length: tuple[int, ...] | None = None
        dash: float | None = None
        gap: float | None = None
        dot_radius: float | None = None
        curvature: float | None = None
        max_turn: float | None = None

    num_classes = 2
    vocab_size = 256

    @property
    def input(self) -> str:
        return str(require_choice("pathfinder: data setting 'input'", self.data.input, INPUTS))

    @property
    def model_kind(self) -> str:  # type: ignore[override]
        return "vit" if self.input == "patches" else "encoder_classifier"

    def prepare(self) -> None:
        d = self.data
        images, labels = pathfinder.load_or_generate(
            d.examples, seed=d.data_seed, size=d.size, num_distractors=d.num_distractors, path_length=d.path_length,
            dash=d.dash, gap=d.gap, dot_radius=d.dot_radius, curvature=d.curvature, max_turn=d.max_turn)
        if self.input == "patches":
            arrays = {"images": images[:, None].astype(np.float32) / 255.0}  # (n, 1, S, S)
        elif d.patch > 1:
            self.vocab_size = 1 << (d.patch * d.patch)
            arrays = {"ids": patch_codes(images, d.patch)}
        else:
            arrays = {"ids": images.reshape(len(images), -1)}
        arrays["labels"] = labels
        parts = split_indices(len(labels), seed=d.data_seed, fractions=d.fractions, stratify=labels)
        self.splits = {name: as_tensors(arrays, np.asarray(index)) for name, index in parts.items()}

    @property
    def image_size(self) -> int:
        return self.data.size

    @property
    def reads(self) -> type[ClassificationTask]:
        """The class whose model input the task gives: pixel tokens or the ``vit``'s patches."""
        return ClassificationTask if self.input == "pixels" else PatchedImageTask

    def model_overrides(self) -> dict[str, Any]:
        return self.reads.model_overrides(self)

    @property
    def seq_len(self) -> int:
        return self.reads.seq_len.fget(self)

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        return self.reads.logits(self, model, batch)

    def batch_tokens(self, batch: Split) -> int:
        return self.reads.batch_tokens(self, batch)
