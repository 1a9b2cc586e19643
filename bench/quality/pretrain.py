"""Self-pretraining (Amos et al. 2023, "Never Train from Scratch"): before it learns a
classification task, the very model learns to denoise the task's own training inputs, and
only then is fine-tuned on the labels. No other data is read, so a variant's figure still
measures what it learns from the task alone.

With ``train.pretrain_steps: P`` the run's first ``P`` of its ``train.steps`` steps are
pretraining: in each training input a ``train.pretrain_mask_rate`` share of the real tokens
(padding never) is replaced by tokens drawn uniformly from the vocabulary, and the model
predicts the original token at those positions from its encoder's last hidden states through
the transposed token embedding (the weights are tied, as in BERT, Devlin et al. 2019). The
classifier head is not used. Each phase has its own warm-up and decay (the schedule of
``train`` over ``P`` steps, then over ``steps - P``), and the optimizer starts afresh at
step ``P``, as a fine-tuning run would; validation and model selection start with
fine-tuning. The masked positions and replacement tokens are a pure function of the run's
seed and the step, so a resumed run sees what an uninterrupted one would."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.engine.config import ConfigError
from bench.quality.settings import TrainSettings
from bench.quality.tasks import ClassificationTask, Task


def supports_pretraining(task: Task) -> bool:
    """Tasks whose model is an encoder reading token ids (``encoder_classifier``)."""
    return isinstance(task, ClassificationTask) and task.model_kind == "encoder_classifier"


def check_pretraining(task: Task, train: TrainSettings) -> None:
    """``ConfigError`` naming ``train.pretrain_steps`` when the task cannot self-pretrain."""
    if train.pretrain_steps and not supports_pretraining(task):
        raise ConfigError(f"train.pretrain_steps: task {task.name!r} ({task.model_kind}) has no "
                          "self-pretraining objective; only tasks read by an encoder_classifier "
                          "have one (set it to 0)", "train.pretrain_steps")


def phase_settings(step: int, train: TrainSettings) -> tuple[int, TrainSettings]:
    """``(step within its phase, the phase's schedule)``: pretraining is ``train`` over
    ``pretrain_steps`` steps, fine-tuning ``train`` over the rest."""
    pretrain = train.pretrain_steps
    if not pretrain:
        return step, train
    if step < pretrain:
        return step, replace(train, steps=pretrain, pretrain_steps=0)
    return step - pretrain, replace(train, steps=train.steps - pretrain, pretrain_steps=0)


def corrupt(ids: Tensor, key_mask: Tensor | None, vocab_size: int, rate: float,
            seed: int, step: int) -> tuple[Tensor, Tensor]:
    """``ids (B, N)`` with a ``rate`` share of the real tokens replaced by uniform draws from
    ``[0, vocab_size)``, and the bool ``(B, N)`` mask of the replaced positions (at least one
    per row that has a real token)."""
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
    """Cross-entropy of the original tokens at the corrupted positions (see the module
    docstring) and the number of input tokens read."""
    ids, key_mask = batch["ids"], batch.get("key_mask")
    weight = model.token_emb.weight  # (V, D), tied output projection
    noisy, where = corrupt(ids, key_mask, weight.shape[0], rate, seed, step)
    hidden, _ = model.encode(noisy, key_mask)  # (B, G + N, D)
    hidden = hidden[:, model.prefix.count:]  # (B, N, D): the prefix tokens dropped
    logits = hidden[where] @ weight.T  # (M, V)
    tokens = int(key_mask.sum()) if key_mask is not None else ids.numel()
    return F.cross_entropy(logits, ids[where]), tokens
