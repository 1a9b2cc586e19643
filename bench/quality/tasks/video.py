"""``video``: the direction of an object moving on a torus canvas, which no single frame decides, read by the
``vivit`` model (docs/quality.md, "Video")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench.quality.data import fashion_mnist
from bench.quality.data.video import Clips, moving_clips
from bench.quality.tasks.base import SPLITS, ClassificationTask, Metric, Split, SplitSizes, to_model_device
from bench.quality.tasks.registration import ConditionView, register_task

#: the clip settings of the data section (moving_clips' arguments)
CLIP = ("frames", "canvas", "object_size", "min_speed", "max_speed", "still_objects", "hold")

PRESETS = {
    "tiny": {
        "data": {"train_examples": 64, "val_examples": 16, "test_examples": 32, "data_seed": 0,
                 "frames": 4, "canvas": 16, "object_size": 7, "min_speed": 1, "max_speed": 3,
                 "still_objects": 1, "patch_size": 8, "tubelet_frames": 1},
        "attention": {"window": 2, "num_landmarks": 4, "positions_per_frame": 4},
    },
    "small": {
        "note": ("8 frames of 32x32 pixels in tubelets of 2 frames x 8x8 pixels: 4 token frames x "
                 "16 positions = 64 tokens; one 14-pixel Fashion-MNIST object moving 4-7 pixels "
                 "a frame."),
        "data": {"train_examples": 4000, "val_examples": 500, "test_examples": 1000, "data_seed": 0,
                 "frames": 8, "canvas": 32, "object_size": 14, "min_speed": 4, "max_speed": 7,
                 "still_objects": 0, "patch_size": 8, "tubelet_frames": 2},
        "attention": {"window": 16, "num_landmarks": 16, "positions_per_frame": 16},
        "train": {"steps": 600},
    },
}


@register_task("video", presets=PRESETS, metric_title="accuracy",
               conditions=(ConditionView("accuracy", "speed=", "Accuracy by speed (pixels a frame, test)"),))
class Video(ClassificationTask):
    """The ``vivit`` model reads ``videos (B, T, 1, C, C)`` in [0, 1]."""

    @dataclass(frozen=True)
    class Data(SplitSizes):
        frames: int = 8
        canvas: int = 32
        object_size: int = 14
        min_speed: int = 4
        max_speed: int = 7
        still_objects: int = 0
        hold: int = 1  # frames the mover holds each position
        patch_size: int = 8  # the model's
        tubelet_frames: int = 1  # the model's

    model_kind = "vivit"
    num_classes = 2

    def clips(self, split: str) -> Clips:
        """The clips of ``split`` (train, val: training images; test: test images)."""
        images = fashion_mnist.load("test" if split == "test" else "train")[0]
        seed = np.random.SeedSequence([self.data.data_seed, SPLITS.index(split)]).generate_state(1)[0]
        return moving_clips(images, getattr(self.data, f"{split}_examples"), seed=int(seed),
                            **{k: getattr(self.data, k) for k in CLIP})

    def prepare(self) -> None:
        for split in SPLITS:
            clips = self.clips(split)
            self.splits[split] = {  # uint8 videos: 1/4 of the memory of float32
                "videos": torch.from_numpy(clips.videos), "labels": torch.from_numpy(clips.labels),
                "speed": torch.from_numpy(clips.speed),
            }

    @property
    def seq_len(self) -> int:
        """Tokens of a clip: token frames x positions."""
        d = self.data
        return d.frames // d.tubelet_frames * (d.canvas // d.patch_size) ** 2

    def model_overrides(self) -> dict[str, Any]:
        return {"frames": self.data.frames, "image_size": self.data.canvas,
                "patch_size": self.data.patch_size, "tubelet_frames": self.data.tubelet_frames, "in_channels": 1,
                "num_classes": self.num_classes, "max_len": self.seq_len}

    def logits(self, model: nn.Module, batch: Split) -> Tensor:
        videos = to_model_device(batch["videos"], model)
        return model(videos[:, :, None].float() / 255.0)  # (B, C)

    def batch_tokens(self, batch: Split) -> int:
        return int(batch["labels"].numel()) * self.seq_len

    def condition_metrics(self, split: str, preds: Tensor, labels: Tensor) -> list[Metric]:
        """Accuracy at each speed (``speed=v``, pixels a frame)."""
        return self.accuracy_by("speed=", self.splits[split]["speed"][: len(labels)], (preds == labels).float())
