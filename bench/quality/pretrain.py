"""Self-pretraining (docs/quality.md, "Training and evaluation"): the first ``train.pretrain_steps`` steps denoise
the task's training inputs through the transposed token embedding, as in BERT."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.engine.config import ConfigError
from bench.quality.settings import TrainSettings
from bench.quality.tasks import ClassificationTask, Task


def check_pretraining(task: Task, train: TrainSettings) -> None:
    """``ConfigError`` naming ``train.pretrain_steps`` when the task cannot self-pretrain."""
    encoder = isinstance(task, ClassificationTask) and task.model_kind == "encoder_classifier"
    if train.pretrain_steps and not encoder:
        raise ConfigError(f"train.pretrain_steps: task {task.name!r} ({task.model_kind}) has no "
                          "self-pretraining objective; only tasks read by an encoder_classifier "
                          "have one (set it to 0)", "train.pretrain_steps")


def phase_settings(step: int, train: TrainSettings) -> tuple[int, TrainSettings]:
    """``(step within its phase, the phase's schedule)``: each phase has its own warm-up and decay."""
    pretrain = train.pretrain_steps
    if not pretrain:
        return step, train
    if step < pretrain:
        return step, replace(train, steps=pretrain, pretrain_steps=0)
    return step - pretrain, replace(train, steps=train.steps - pretrain, pretrain_steps=0)


def corrupt(ids: Tensor, key_mask: Tensor | None, vocab_size: int, rate: float,
            seed: int, step: int) -> tuple[Tensor, Tensor]:
    """``ids`` with a ``rate`` share of the real tokens (one a row at least) replaced by uniform draws, and where."""
    gen = np.random.default_rng([seed, step, 0x5E1F])
    real = np.ones(ids.shape, bool) if key_mask is None else key_mask.cpu().numpy().astype(bool)
    chosen = (gen.random(ids.shape) < rate) & real
    for row in np.flatnonzero(~chosen.any(axis=1) & real.any(axis=1)):  # never an empty target
        chosen[row, gen.choice(np.flatnonzero(real[row]))] = True
    noise = torch.from_numpy(gen.integers(0, vocab_size, ids.shape)).to(ids)
    where = torch.from_numpy(chosen).to(ids.device)
    return torch.where(where, noise, ids), where


def denoising_loss(model: nn.Module, batch: dict[str, Tensor], rate: float, seed: int,
                   step: int) -> tuple[Tensor, int]:
    """Cross-entropy of the original tokens at the corrupted positions, and the input tokens read."""
    ids, key_mask = batch["ids"], batch.get("key_mask")
    weight = model.token_emb.weight  # (V, D), tied output projection
    noisy, where = corrupt(ids, key_mask, weight.shape[0], rate, seed, step)
    hidden, _ = model.encode(noisy, key_mask)  # (B, G + N, D)
    hidden = hidden[:, model.prefix.count:]  # (B, N, D): the prefix tokens dropped
    logits = hidden[where] @ weight.T  # (M, V)
    tokens = int(key_mask.sum()) if key_mask is not None else ids.numel()
    return F.cross_entropy(logits, ids[where]), tokens
