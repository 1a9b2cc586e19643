"""A classifier of single frames averaged over time: the ``video`` task's per-frame control (docs/quality.md,
"Video"), which must stay at chance there."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

#: the MLP's hidden width, epochs over the training frames, batch and learning rate (not chosen on validation)
HIDDEN, EPOCHS, BATCH, LR = 64, 3, 256, 1e-3


def _frames(videos: Tensor) -> Tensor:
    """``videos (n, T, H, W)`` uint8 -> ``(n, T, H*W)`` float in [0, 1]."""
    return videos.reshape(videos.shape[0], videos.shape[1], -1).float() / 255.0


def per_frame_predictions(train_videos: Tensor, train_labels: Tensor, test_videos: Tensor,
                          num_classes: int, seed: int = 0) -> np.ndarray:
    """Labels of ``test_videos (m, T, H, W)`` by an MLP trained on single frames of ``train_videos`` labelled with
    their clip's label, the frames' log-probabilities averaged over time."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x = _frames(train_videos)  # (n, T, P)
        frames, pixels = x.shape[1], x.shape[2]
        x = x.reshape(-1, pixels)  # (n*T, P): every frame an example
        y = train_labels.repeat_interleave(frames)  # (n*T,)
        model = nn.Sequential(nn.Linear(pixels, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, num_classes))
        optimiser = torch.optim.Adam(model.parameters(), lr=LR)
        for _ in range(EPOCHS):
            for index in torch.randperm(len(y)).split(BATCH):
                loss = nn.functional.cross_entropy(model(x[index]), y[index])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        with torch.no_grad():
            test = _frames(test_videos)  # (m, T, P)
            scores = model(test).log_softmax(dim=-1).mean(dim=1)  # (m, C): frames averaged
    return scores.argmax(dim=-1).numpy()
