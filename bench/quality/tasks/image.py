"""``image`` and ``image_vit``: Fashion-MNIST (10 classes of 28x28 grey images).

``image`` reads the pixels as a sequence of 784 tokens (grey level = token id), the LRA
"Image" protocol; ``image_vit`` cuts the image into patches for the ``vit`` model. Training
and validation come from the 60,000 training images (a seeded subset and a disjoint held-out
part); the test split comes from the 10,000 test images only."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.quality.data import fashion_mnist
from bench.quality.tasks.base import ClassificationTask, PatchedImageTask, as_tensors


def _subsets(data: dict[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded, disjoint train / val subsets of the training images and a test subset."""
    rng = np.random.default_rng(int(data.get("data_seed", 0)))
    images, labels = fashion_mnist.load("train")
    order = rng.permutation(len(labels))
    n_train, n_val = int(data["train_examples"]), int(data["val_examples"])
    train, val = order[:n_train], order[n_train:n_train + n_val]
    test_images, test_labels = fashion_mnist.load("test")
    test = rng.permutation(len(test_labels))[: int(data["test_examples"])]
    return {"train": (images[train], labels[train]), "val": (images[val], labels[val]),
            "test": (test_images[test], test_labels[test])}


def downsample(images: np.ndarray, factor: int) -> np.ndarray:
    """Average ``factor x factor`` pixel blocks of ``images (n, 28, 28)``, rounded (uint8)."""
    if factor == 1:
        return images
    n, side = images.shape[0], images.shape[1] // factor
    blocks = images[:, : side * factor, : side * factor].reshape(n, side, factor, side, factor)
    return np.rint(blocks.mean(axis=(2, 4))).astype(np.uint8)


class ImagePixels(ClassificationTask):
    """Data settings: ``train_examples``, ``val_examples``, ``test_examples``, ``data_seed``,
    ``downsample`` (average-pool factor, default 1). Each pixel is a token (grey level 0..255);
    ``seq_len`` is 784, or (28 / downsample)^2."""

    name = "image"
    num_classes = 10
    vocab_size = 256

    def prepare(self) -> None:
        factor = int(self.data.get("downsample", 1))
        for split, (images, labels) in _subsets(self.data).items():
            pixels = downsample(images, factor)
            arrays = {"ids": pixels.reshape(len(pixels), -1), "labels": labels}
            self.splits[split] = as_tensors(arrays, np.arange(len(labels)))


class ImagePatches(PatchedImageTask):
    """Data settings as ``image`` plus the model's ``patch_size`` (model settings). The
    ``vit`` model reads ``images (B, 1, 28, 28)`` scaled to [0, 1]."""

    name = "image_vit"
    model_kind = "vit"
    num_classes = 10
    image_size = 28  # type: ignore[assignment]

    def prepare(self) -> None:
        for split, (images, labels) in _subsets(self.data).items():
            arrays = {"images": images[:, None].astype(np.float32) / 255.0, "labels": labels}
            self.splits[split] = as_tensors(arrays, np.arange(len(labels)))
