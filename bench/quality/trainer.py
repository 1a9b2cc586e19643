"""The training loop of one run (docs/quality.md, "Training and evaluation"): a checkpoint that fails
verification is moved aside and the run falls back to the one before it; a NaN or inf stops the run."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attn.position_bias import RelativePositionBias
from bench.engine.measure import tensor_peak_bytes_cpu, tensor_peak_bytes_cuda
from bench.quality.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model_state,
    load_optimizer_state,
    model_state,
    move_aside,
    optimizer_state,
    save_checkpoint,
)
from bench.quality.pretrain import denoising_loss, phase_settings
from bench.quality.run_spec import RunSpec
from bench.quality.settings import TaskSettings, TrainSettings
from bench.quality.tasks import Task

LAST, BEST = "last.safetensors", "best.safetensors"
#: the checkpoint before ``last.safetensors``: a resume falls back to it when the last fails verification
PREVIOUS = "last.prev.safetensors"


class LossReader:
    """Training losses read on the host; with ``defer`` only at validation or checkpoint steps, in
    one transfer, so a step never waits for the device to finish the ones queued before it."""

    def __init__(self, defer: bool) -> None:
        self.defer = defer
        self._pending: list[tuple[int, Tensor]] = []

    def add(self, step: int, loss: Tensor, *, now: bool = False) -> list[tuple[int, float]]:
        """Queue ``step``'s loss; the ``(step, value)`` pairs read (all queued, unless deferred)."""
        self._pending.append((step, loss))
        if self.defer and not now:
            return []
        steps = [s for s, _ in self._pending]
        values = torch.stack([t.float() for _, t in self._pending]).tolist()
        self._pending.clear()
        return list(zip(steps, values, strict=True))


def learning_rate(step: int, train: TrainSettings) -> float:
    """Linear warm-up to ``lr``, then cosine or linear decay to ``min_lr_ratio * lr``, per phase."""
    step, train = phase_settings(step, train)
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    span = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if train.schedule == "cosine" else 1 - progress
    return train.lr * (train.min_lr_ratio + (1 - train.min_lr_ratio) * shape)


def make_optimizer(model: nn.Module, train: TrainSettings) -> torch.optim.AdamW:
    """AdamW in groups: decay on matrices; none on biases and norms; relative-position bias tables with no decay
    and ``lr_scale = train.position_bias_lr_scale``, which :meth:`Trainer._step` multiplies in."""
    tables = {id(p) for module in model.modules() if isinstance(module, RelativePositionBias)
              for p in module.parameters(recurse=False)}
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2 and id(p) not in tables]
    rest = [p for p in trainable if p.dim() < 2 and id(p) not in tables]
    bias_tables = [p for p in trainable if id(p) in tables]
    groups = [{"params": decay, "weight_decay": train.weight_decay, "lr_scale": 1.0},
              {"params": rest, "weight_decay": 0.0, "lr_scale": 1.0}]
    if bias_tables:
        groups.append({"params": bias_tables, "weight_decay": 0.0,
                       "lr_scale": train.position_bias_lr_scale})
    return torch.optim.AdamW(groups, lr=train.lr)


@dataclass
class Progress:
    """Counters a resumed run continues from."""

    step: int = 0
    tokens: int = 0
    train_time_s: float = 0.0
    best_value: float | None = None
    best_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    threads: int | None = None  # torch threads of the run: a resume uses them for identical sums


def rng_state() -> dict[str, Tensor]:
    """The CPU generator's state and every CUDA device's, so dropout on a GPU resumes exactly."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = state
    return tensors


def restore_rng(tensors: dict[str, Tensor]) -> None:
    """Set the generators :func:`rng_state` saved (CUDA ones as far as both have devices)."""
    torch.set_rng_state(tensors["rng.torch"])
    cuda = []
    while f"rng.cuda.{len(cuda)}" in tensors:
        cuda.append(tensors[f"rng.cuda.{len(cuda)}"])
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


class Trainer:
    """The training loop of one run."""

    def __init__(self, spec: RunSpec, settings: TaskSettings, task: Task, model: nn.Module,
                 fingerprint: str, log: Callable[[str], None]) -> None:
        self.spec, self.settings, self.task, self.model = spec, settings, task, model
        self.train = settings.train
        self.out = Path(spec.out)
        self.device = torch.device(spec.device)
        self.optimizer = make_optimizer(model, self.train)
        self.fingerprint = fingerprint
        self.progress = Progress(threads=torch.get_num_threads())
        self.log = log
        #: what happened to checkpoints that failed verification (said in metrics.json too)
        self.recovery: list[str] = []
        #: ``(step, what)`` when the run diverged (a NaN or inf loss or weight); it stopped there
        self.diverged: tuple[int, str] | None = None

    def save_last(self) -> None:
        """Write ``last.safetensors``; the one before it becomes ``last.prev.safetensors``."""
        tensors, optim_meta = optimizer_state(self.optimizer)
        tensors = {**model_state(self.model), **tensors, **rng_state()}
        meta = {"fingerprint": self.fingerprint, "optimizer": optim_meta,
                "progress": asdict(self.progress)}
        if (self.out / LAST).exists():
            os.replace(self.out / LAST, self.out / PREVIOUS)
        save_checkpoint(self.out / LAST, tensors, meta)

    def _bad_checkpoint(self, path: Path, err: CheckpointError, then: str) -> None:
        """Move a checkpoint that failed verification aside and say so, in one line."""
        aside = move_aside(path)
        note = f"{err}; moved to {aside.name}; {then}"
        self.recovery.append(note)
        self.log(note)

    def _verified(self) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """The newest checkpoint that passes verification, or None; each that fails is moved aside."""
        candidates = [path for path in (self.out / LAST, self.out / PREVIOUS) if path.exists()]
        for index, path in enumerate(candidates):
            try:
                tensors, meta = load_checkpoint(path)
            except CheckpointError as err:
                fallback = index + 1 < len(candidates)
                self._bad_checkpoint(path, err, f"trying {candidates[index + 1].name}"
                                     if fallback else "training starts over")
                continue
            return path, tensors, meta
        return None

    def _best_is_sound(self, meta: dict[str, Any]) -> bool:
        """Whether the best checkpoint a resumed run counts on is there and sound."""
        if meta.get("progress", {}).get("best_step") is None:
            return True
        try:
            load_checkpoint(self.out / BEST)
        except FileNotFoundError:
            note = f"{self.out / BEST}: missing, and the run counts on it; training starts over"
            self.recovery.append(note)
            self.log(note)
            return False
        except CheckpointError as err:
            self._bad_checkpoint(self.out / BEST, err, "the best weights are lost: training "
                                                       "starts over")
            return False
        return True

    def resume(self) -> bool:
        """Continue from the newest sound checkpoint of this run; False when training starts over."""
        found = self._verified()
        if found is None:
            return False
        path, tensors, meta = found
        if meta.get("fingerprint") != self.fingerprint:
            self.log(f"{path}: a checkpoint of another configuration; starting over")
            return False
        if not self._best_is_sound(meta):
            return False
        load_model_state(self.model, tensors)
        load_optimizer_state(self.optimizer, tensors, meta["optimizer"])
        restore_rng(tensors)
        self.progress = Progress(**meta["progress"])
        recorded = self.progress.threads
        if recorded and recorded != torch.get_num_threads():
            if self.spec.threads:  # asked for explicitly: honoured, with the consequence said
                self.log(f"resuming with {self.spec.threads} threads where the run began with "
                         f"{recorded}: sums round differently, the result is not bit-identical")
                self.progress.threads = self.spec.threads
            else:
                torch.set_num_threads(recorded)  # restored by train_run's torch_threads scope
        where = "" if path.name == LAST else f" ({path.name})"
        self.log(f"resumed from step {self.progress.step}{where}")
        return True

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on CUDA (training, validation and the final test evaluation)."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _step(self, step: int) -> tuple[Tensor, int]:
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(step, self.train) * group.get("lr_scale", 1.0)
        batch = {k: v.to(self.device) for k, v in self.task.train_batch(step, self.train.batch_size).items()}
        with self.autocast():
            if step < self.train.pretrain_steps:  # self-pretraining: denoise the inputs
                loss, tokens = denoising_loss(self.model, batch, self.train.pretrain_mask_rate,
                                              self.spec.seed, step)
            else:
                loss, tokens = self.task.loss(self.model, batch)
        loss.backward()
        if self.train.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), tokens

    def _measured_step(self, step: int) -> tuple[Tensor, int]:
        """A step whose tensor-level peak memory is read (its time is not counted)."""
        result: list[tuple[Tensor, int]] = []
        if self.device.type == "cuda":
            peak = tensor_peak_bytes_cuda(lambda: result.append(self._step(step)), self.device)
        else:
            peak = tensor_peak_bytes_cpu(lambda: result.append(self._step(step)))
        self.progress.peak_mem_bytes = peak
        return result[0]

    def validate(self, step: int) -> None:
        name, higher = self.task.selection
        self.model.eval()
        with torch.no_grad(), self.autocast():
            metrics = self.task.evaluate(self.model, "val", limit=self.train.eval_examples,
                                         batch_size=self.train.batch_size, final=False)
        value = next(m.value for m in metrics if m.name == name and not m.condition)
        self.progress.history.append({"step": step + 1, name: value})
        best = self.progress.best_value
        if best is None or (value > best if higher else value < best):
            self.progress.best_value, self.progress.best_step = value, step + 1
            save_checkpoint(self.out / BEST, model_state(self.model),
                            {"fingerprint": self.fingerprint, "step": step + 1, name: value})
        self.log(f"step {step + 1}: val {name} {value:.4f} (best {self.progress.best_value:.4f} "
                 f"at step {self.progress.best_step})")

    def run(self, on_step: Callable[[int, float, float], None] | None = None) -> None:
        """Train from the current step to ``steps`` (validating and checkpointing on the way)."""
        first = self.progress.step
        losses = LossReader(defer=self.device.type == "cuda" and on_step is None)
        for step in range(first, self.train.steps):
            if step == self.train.pretrain_steps > 0:  # fine-tuning starts with a fresh optimizer
                self.optimizer = make_optimizer(self.model, self.train)
            last = step + 1 == self.train.steps
            fine_tuning = step >= self.train.pretrain_steps  # no model selection before it
            evaluate = fine_tuning and ((step + 1) % self.train.eval_every == 0 or last)
            checkpoint = (step + 1) % self.train.checkpoint_every == 0 or last
            start = time.perf_counter()
            loss, tokens = self._measured_step(step) if step == first else self._step(step)
            read = losses.add(step, loss, now=evaluate or checkpoint)  # waits for queued steps
            if step != first:
                self.progress.train_time_s += time.perf_counter() - start
                self.progress.tokens += tokens
            self.progress.step = step + 1
            bad = next(((s, v) for s, v in read if not math.isfinite(v)), None)
            if bad is not None:  # diverged: stop, and keep the last sound checkpoint
                self.diverged = (bad[0] + 1, f"the training loss became {bad[1]}")
                self.log(f"step {bad[0] + 1}: the training loss is {bad[1]}; the run diverged")
                return
            if evaluate:
                self.validate(step)
            if checkpoint:
                self.save_last()
            if on_step is not None:
                loss = read[-1][1]
                rate = self.progress.tokens / max(self.progress.train_time_s, 1e-9)
                on_step(step + 1, loss, rate)
        broken = next((name for name, p in self.model.named_parameters()  # the last update:
                       if not bool(torch.isfinite(p).all())), None)   # no loss came after it
        if broken is not None:
            self.diverged = (self.progress.step, f"parameter {broken} became NaN or inf")
            self.log(f"step {self.progress.step}: parameter {broken} is not finite; the run diverged")
