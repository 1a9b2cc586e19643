"""``image`` and ``image_vit``: Fashion-MNIST read as pixel tokens (LRA's "Image") or as the ``vit``'s patches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.quality.data import fashion_mnist
from bench.quality.tasks.base import ClassificationTask, PatchedImageTask, Split, SplitSizes, as_tensors
from bench.quality.tasks.registration import register_task


def _splits(data: SplitSizes, inputs: Callable[[np.ndarray], dict[str, np.ndarray]]) -> dict[str, Split]:
    """Seeded, disjoint train / val subsets of the training images and a test subset: ``inputs(images)``, labels."""
    rng = np.random.default_rng(data.data_seed)
    images, labels = fashion_mnist.load("train")
    order = rng.permutation(len(labels))
    n_train, n_val = data.train_examples, data.val_examples
    train, val = order[:n_train], order[n_train:n_train + n_val]
    test_images, test_labels = fashion_mnist.load("test")
    test = rng.permutation(len(test_labels))[: data.test_examples]
    parts = {"train": (images[train], labels[train]), "val": (images[val], labels[val]),
             "test": (test_images[test], test_labels[test])}
    return {split: as_tensors({**inputs(images), "labels": labels}, np.arange(len(labels)))
            for split, (images, labels) in parts.items()}


def downsample(images: np.ndarray, factor: int) -> np.ndarray:
    """Average ``factor x factor`` pixel blocks of ``images (n, 28, 28)``, rounded (uint8)."""
    if factor == 1:
        return images
    n, side = images.shape[0], images.shape[1] // factor
    blocks = images[:, : side * factor, : side * factor].reshape(n, side, factor, side, factor)
    return np.rint(blocks.mean(axis=(2, 4))).astype(np.uint8)


PIXEL_PRESETS = {
    "tiny": {
        "data": {"train_examples": 64, "val_examples": 16, "test_examples": 32, "data_seed": 0},
    },
    "small": {
        "note": ("Fashion-MNIST pooled 2x2 to 14x14 = 196 pixel tokens (LRA uses CIFAR-10, 1,024 "
                 "tokens)."),
        "data": {"train_examples": 6000, "val_examples": 500, "test_examples": 1000, "data_seed": 0,
                 "downsample": 2},
    },
    # lra: lra_benchmarks/image/configs/cifar10/base_cifar10_config.py: emb 32, 1 head, 1 layer,
    # mlp 64, batch 256, 200 epochs of 45,000 images, lr 5e-4, cosine
    "lra": {
        "data": {"train_examples": 50000, "val_examples": 10000, "test_examples": 10000,
                 "data_seed": 0},
        "model": {"d_model": 32, "num_heads": 1, "num_layers": 1, "d_ff": 64, "dropout": 0.3},
        "train": {"steps": 39000, "batch_size": 256, "lr": 0.0005, "weight_decay": 0.0,
                  "warmup_steps": 195, "eval_every": 1950, "checkpoint_every": 1950},
    },
}


@register_task("image", order=4, presets=PIXEL_PRESETS)
class ImagePixels(ClassificationTask):
    """Each pixel is a token (grey level 0..255); ``seq_len`` is 784, or (28 / downsample)^2."""

    @dataclass(frozen=True)
    class Data(SplitSizes):
        downsample: int = 1  # average-pool factor

    num_classes = 10
    vocab_size = 256

    def prepare(self) -> None:
        self.splits = _splits(self.data, lambda images: {
            "ids": downsample(images, self.data.downsample).reshape(len(images), -1)})


PATCH_PRESETS = {
    "tiny": {
        "data": {"train_examples": 64, "val_examples": 16, "test_examples": 32, "data_seed": 0,
                 "patch_size": 7},
        "model": {"patch_size": 7},
        "attention": {"window": 2, "num_landmarks": 4},
    },
    "small": {
        "data": {"train_examples": 6000, "val_examples": 500, "test_examples": 1000, "data_seed": 0,
                 "patch_size": 4},
        "model": {"patch_size": 4},
        "attention": {"window": 4, "num_global": 1, "num_landmarks": 8},
    },
    "lra": {
        "data": {"train_examples": 50000, "val_examples": 10000, "test_examples": 10000,
                 "data_seed": 0},
        "model": {"patch_size": 4, "d_model": 128, "num_heads": 4, "num_layers": 4, "d_ff": 512},
        "attention": {"window": 8, "num_global": 1, "num_landmarks": 16},
        "train": {"steps": 39000, "batch_size": 256, "lr": 0.0005, "weight_decay": 0.0,
                  "warmup_steps": 195, "eval_every": 1950, "checkpoint_every": 1950},
    },
}


@register_task("image_vit", order=5, presets=PATCH_PRESETS)
class ImagePatches(PatchedImageTask):
    """The ``vit`` model reads ``images (B, 1, 28, 28)`` scaled to [0, 1]."""

    @dataclass(frozen=True)
    class Data(SplitSizes):
        patch_size: int = 4

    model_kind = "vit"
    num_classes = 10
    image_size = 28  # type: ignore[assignment]

    def prepare(self) -> None:
        self.splits = _splits(self.data, lambda images: {"images": images[:, None].astype(np.float32) / 255.0})
