"""``video``: the direction of an object moving on a canvas, which no single frame decides
(clips generated from Fashion-MNIST, :mod:`bench.quality.data.video`), read by the ``vivit``
model (Arnab et al. 2021).

Each clip holds a moving Fashion-MNIST object (and, by a setting, a still one) on a torus;
the label is whether
the mover goes forward (right or down) or backward (left or up). The two classes hold the
same frames in the same distribution and differ only in their order, so a classifier of
single frames averaged over time stays at chance (the reference ``per_frame``), and a model
must relate frames to answer. Training and validation clips are drawn from the 60,000
training images, test clips from the 10,000 test images, each split from its own seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench.quality.data import fashion_mnist
from bench.quality.data.video import Clips, moving_clips
from bench.quality.tasks.base import ClassificationTask, Metric, Split, to_model_device
from bench.quality.tasks.registration import ConditionView, register_task

#: the clip settings (data section) and their defaults
CLIP_DEFAULTS: dict[str, int] = {"frames": 8, "canvas": 32, "object_size": 14, "min_speed": 4,
                                 "max_speed": 7, "still_objects": 0}

PRESETS = {
    "tiny": {
        "data": {"train_examples": 64, "val_examples": 16, "test_examples": 32, "data_seed": 0,
                 "frames": 4, "canvas": 16, "object_size": 7, "min_speed": 1, "max_speed": 3,
                 "still_objects": 1, "patch_size": 8, "tubelet_frames": 1},
        "attention": {"window": 2, "num_landmarks": 4, "positions_per_frame": 4},
    },
    # calibrated with full attention (docs/quality.md): tubelets of 2 frames learn it (test
    # 99.6% at 600 steps), tubelets of 1 frame stay at chance through 500 of 600 steps
    "small": {
        "note": ("8 frames of 32x32 pixels in tubelets of 2 frames x 8x8 pixels: 4 token frames x "
                 "16 positions = 64 tokens; one 14-pixel Fashion-MNIST object moving 4-7 pixels "
                 "a frame."),
        "data": {"train_examples": 4000, "val_examples": 500, "test_examples": 1000, "data_seed": 0,
                 **CLIP_DEFAULTS, "patch_size": 8, "tubelet_frames": 2},
        "attention": {"window": 16, "num_landmarks": 16, "positions_per_frame": 16},
        "train": {"steps": 600},
    },
}


@register_task("video", presets=PRESETS, metric_title="accuracy",
               conditions=(ConditionView("accuracy", "speed=", "Accuracy by speed (pixels a frame, test)"),))
class Video(ClassificationTask):
    """Data settings: ``train_examples``, ``val_examples``, ``test_examples``, ``data_seed``,
    the clip settings ``frames``, ``canvas``, ``object_size``, ``min_speed``, ``max_speed``,
    ``still_objects``, ``hold`` (frames the mover holds each position, default 1) and the
    model's ``patch_size`` (default 8) and ``tubelet_frames`` (default 1). The ``vivit`` model
    reads ``videos (B, T, 1, C, C)`` in [0, 1]."""

    model_kind = "vivit"
    num_classes = 2

    def setting(self, name: str) -> int:
        """A clip setting of the data section (its default in :data:`CLIP_DEFAULTS`)."""
        return int(self.data.get(name, CLIP_DEFAULTS[name]))

    def clips(self, split: str) -> Clips:
        """The clips of ``split`` (train, val: training images; test: test images)."""
        images = fashion_mnist.load("test" if split == "test" else "train")[0]
        count = int(self.data[f"{split}_examples"])
        seed = [int(self.data.get("data_seed", 0)), ("train", "val", "test").index(split)]
        # hold is read apart from CLIP_DEFAULTS: the presets spread those into their data
        # section, and a new key there would change the settings (and identity) of every
        # committed video unit, though hold=1 leaves every clip as it was
        return moving_clips(images, count, seed=int(np.random.SeedSequence(seed).generate_state(1)[0]),
                            hold=int(self.data.get("hold", 1)), **{k: self.setting(k) for k in CLIP_DEFAULTS})

    def prepare(self) -> None:
        for split in ("train", "val", "test"):
            clips = self.clips(split)
            self.splits[split] = {  # uint8 videos: 1/4 of the memory of float32
                "videos": torch.from_numpy(clips.videos), "labels": torch.from_numpy(clips.labels),
                "speed": torch.from_numpy(clips.speed),
            }

    @property
    def patch_size(self) -> int:
        return int(self.data.get("patch_size", 8))

    @property
    def tubelet_frames(self) -> int:
        return int(self.data.get("tubelet_frames", 1))

    @property
    def seq_len(self) -> int:
        """Tokens of a clip: token frames x positions."""
        frames = self.setting("frames") // self.tubelet_frames
        return frames * (self.setting("canvas") // self.patch_size) ** 2

    def model_overrides(self) -> dict[str, Any]:
        return {"frames": self.setting("frames"), "image_size": self.setting("canvas"),
                "patch_size": self.patch_size, "tubelet_frames": self.tubelet_frames, "in_channels": 1,
                "num_classes": self.num_classes, "max_len": self.seq_len}

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        videos = to_model_device(batch["videos"], model)
        return model(videos[:, :, None].float() / 255.0)  # (B, C)

    def batch_tokens(self, batch: Split) -> int:
        return int(batch["labels"].numel()) * self.seq_len

    def condition_metrics(self, split: str, preds: Tensor, labels: Tensor) -> list[Metric]:
        """Accuracy at each speed (``speed=v``, pixels a frame)."""
        speed = self.splits[split]["speed"][: len(labels)]
        return [Metric("accuracy", float((preds[speed == v] == labels[speed == v]).float().mean()),
                       f"speed={v}") for v in torch.unique(speed).tolist()]
