"""One training run: a variant on a task with a preset and a seed, resumable after a kill.

AdamW (no decay on biases and norms), linear warm-up then cosine (or linear) decay, gradient
clipping, bf16 autocast on CUDA, validation every ``eval_every`` steps with the best-
validation weights kept as ``best.safetensors``, a resumable ``last.safetensors`` (weights,
optimizer state, RNG state, counters) every ``checkpoint_every`` steps, and one evaluation of
the test split at the end, on the best checkpoint. Batches are a pure function of (seed,
step), so a resumed run takes exactly the path of an uninterrupted one.

The run directory holds ``settings.json`` (the full configuration), the checkpoints and
``metrics.json`` (the result rows); :func:`train_run` returns the rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attn import Attention
from attn.position_bias import RelativePositionBias
from bench.engine.config import import_plugins
from bench.engine.fsutil import atomic_write_json
from bench.engine.measure import tensor_peak_bytes_cpu, tensor_peak_bytes_cuda
from bench.engine.threads import torch_threads
from bench.quality.budget import REFERENCE, StepFlops, matched_budget, task_step_flops
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
from bench.quality.model_parts import label, model_parts
from bench.quality.pretrain import check_pretraining, denoising_loss, phase_settings
from bench.quality.settings import TaskSettings, TrainSettings, attention_params, task_settings
from bench.quality.tasks import Metric, Task, get_task
from models import create_model

LAST, BEST, METRICS, SETTINGS = "last.safetensors", "best.safetensors", "metrics.json", "settings.json"
#: the checkpoint before ``last.safetensors``: a resume falls back to it when the last fails
#: verification (bench/quality/checkpoint.py)
PREVIOUS = "last.prev.safetensors"


@dataclass(frozen=True)
class RunSpec:
    """What to train: task, variant and its explicit parameters, preset, seed, where."""

    task: str
    variant: str
    preset: str
    seed: int
    out: str
    params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    threads: int | None = None
    kernel: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # settings overrides (tests, sweeps)
    plugins: tuple[str, ...] = ()  # modules imported first (they register attentions)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def learning_rate(step: int, train: TrainSettings) -> float:
    """Linear warm-up to ``lr``, then cosine or linear decay to ``min_lr_ratio * lr``; with
    self-pretraining, once over its steps and once over fine-tuning's (bench/quality/pretrain.py)."""
    step, train = phase_settings(step, train)
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    span = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if train.schedule == "cosine" else 1 - progress
    return train.lr * (train.min_lr_ratio + (1 - train.min_lr_ratio) * shape)


def make_optimizer(model: nn.Module, train: TrainSettings) -> torch.optim.AdamW:
    """AdamW in three groups: weight decay on matrices; none on biases and norms; and the
    relative-position bias tables (:class:`attn.position_bias.RelativePositionBias`), with no
    weight decay and the learning rate times ``train.position_bias_lr_scale``.

    A bias table enters the scores additively, one scalar per head and offset, so AdamW moves
    each entry by about the learning rate per step: at the ``small`` preset's budget the
    tables would stay too small to change a softmax over hundreds of keys (docs/quality.md,
    "The relative bias's learning rate"). Each group keeps its ``lr_scale``, which the
    schedule multiplies in (:meth:`Trainer._step`).
    """
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


def _fingerprint(settings: TaskSettings, spec: RunSpec, params: dict[str, Any]) -> str:
    """What a checkpoint must match to be resumed (not where it lives or how many threads)."""
    key = {"settings": settings.to_dict(), "task": spec.task, "variant": spec.variant,
           "params": params, "seed": spec.seed, "kernel": spec.kernel}
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _Progress:
    """Counters a resumed run continues from."""

    step: int = 0
    tokens: int = 0
    train_time_s: float = 0.0
    best_value: float | None = None
    best_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    threads: int | None = None  # torch threads of the run: a resume uses them for identical sums


class Trainer:
    """The training loop of one run (see the module docstring)."""

    def __init__(self, spec: RunSpec, settings: TaskSettings, task: Task, model: nn.Module,
                 fingerprint: str, log: Callable[[str], None]) -> None:
        self.spec, self.settings, self.task, self.model = spec, settings, task, model
        self.train = settings.train
        self.out = Path(spec.out)
        self.device = torch.device(spec.device)
        self.optimizer = make_optimizer(model, self.train)
        self.fingerprint = fingerprint
        self.progress = _Progress(threads=torch.get_num_threads())
        self.log = log
        #: what happened to checkpoints that failed verification (said in metrics.json too)
        self.recovery: list[str] = []
        #: ``(step, what)`` when the run diverged (a NaN or inf loss or weight); it stopped there
        self.diverged: tuple[int, str] | None = None

    # checkpoints
    def save_last(self) -> None:
        """Write ``last.safetensors``; the one before it becomes ``last.prev.safetensors``."""
        tensors, optim_meta = optimizer_state(self.optimizer)
        tensors = {**model_state(self.model), **tensors, "rng.torch": torch.get_rng_state()}
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
        """The newest checkpoint of this run that passes verification (the last one, else the
        one before it), or None; each that fails is moved aside and said."""
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
        """Whether the best-validation checkpoint a resumed run counts on is there and passes
        verification (a bad one is moved aside and said)."""
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
        """Continue from ``last.safetensors`` when it belongs to this run and passes
        verification, else from the checkpoint before it; a checkpoint that fails is moved
        aside (``<name>.corrupt``) and said, and with none left training starts over."""
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
        torch.set_rng_state(tensors["rng.torch"])
        self.progress = _Progress(**meta["progress"])
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

    # one step
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _step(self, step: int) -> tuple[float, int]:
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(step, self.train) * group.get("lr_scale", 1.0)
        batch = {k: v.to(self.device) for k, v in self.task.train_batch(step, self.train.batch_size).items()}
        with self._autocast():
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
        return float(loss.detach()), tokens

    def _measured_step(self, step: int) -> tuple[float, int]:
        """A step whose tensor-level peak memory is read (its time is not counted)."""
        result: list[tuple[float, int]] = []
        if self.device.type == "cuda":
            peak = tensor_peak_bytes_cuda(lambda: result.append(self._step(step)), self.device)
        else:
            peak = tensor_peak_bytes_cpu(lambda: result.append(self._step(step)))
        self.progress.peak_mem_bytes = peak
        return result[0]

    # validation
    def validate(self, step: int) -> None:
        name, higher = self.task.selection
        self.model.eval()
        with torch.no_grad(), self._autocast():
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
        for step in range(first, self.train.steps):
            if step == self.train.pretrain_steps > 0:  # fine-tuning starts with a fresh optimizer
                self.optimizer = make_optimizer(self.model, self.train)
            if step == first:
                loss, _ = self._measured_step(step)
            else:
                start = time.perf_counter()
                loss, tokens = self._step(step)
                self.progress.train_time_s += time.perf_counter() - start
                self.progress.tokens += tokens
            self.progress.step = step + 1
            if not math.isfinite(loss):  # diverged: stop, and keep the last sound checkpoint
                self.diverged = (step + 1, f"the training loss became {loss}")
                self.log(f"step {step + 1}: the training loss is {loss}; the run diverged")
                return
            last = step + 1 == self.train.steps
            fine_tuning = step >= self.train.pretrain_steps  # no model selection before it
            if fine_tuning and ((step + 1) % self.train.eval_every == 0 or last):
                self.validate(step)
            if (step + 1) % self.train.checkpoint_every == 0 or last:
                self.save_last()
            if on_step is not None:
                rate = self.progress.tokens / max(self.progress.train_time_s, 1e-9)
                on_step(step + 1, loss, rate)
        broken = next((name for name, p in self.model.named_parameters()  # the last update:
                       if not bool(torch.isfinite(p).all())), None)   # no loss came after it
        if broken is not None:
            self.diverged = (self.progress.step, f"parameter {broken} became NaN or inf")
            self.log(f"step {self.progress.step}: parameter {broken} is not finite; the run diverged")


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _rows(spec: RunSpec, settings: TaskSettings, task: Task, params: dict[str, Any], parts: Any,
          progress: _Progress, metrics: dict[str, list[Metric]], model: nn.Module,
          budget: dict[str, Any]) -> list[dict]:
    common = {
        "task": spec.task, "variant": spec.variant, "label": label(spec.variant, params),
        "params": json.dumps(params, sort_keys=True), "seed": spec.seed, "preset": spec.preset,
        "model_kind": task.model_kind, "seq_len": task.seq_len,
        "attention_parts": parts.description, "status": "ok", "reason": "",
        "steps": progress.step, "best_step": progress.best_step,
        "train_time_s": progress.train_time_s,
        "train_tokens_per_s": progress.tokens / progress.train_time_s if progress.train_time_s else None,
        "peak_mem_bytes": progress.peak_mem_bytes, "param_count": _param_count(model),
        "kernel_path": _kernel_paths(model),
        "settings": settings.to_json(), **budget,
    }
    rows = []
    for split, found in metrics.items():
        tokens = sum(m.tokens for m in found)
        seconds = sum(m.seconds for m in found)
        for m in found:
            rows.append({**common, "split": split, "metric": m.name, "condition": m.condition,
                         "value": m.value,
                         "eval_tokens_per_s": tokens / seconds if seconds else None})
    return rows


def _kernel_paths(model: nn.Module) -> str:
    """What the model's attention modules last ran (kernel and path), de-duplicated."""
    seen = []
    for module in model.modules():
        if isinstance(module, Attention) and module.last_path is not None:
            text = f"{module.last_path.kernel}: {module.last_path.path}"
            if text not in seen:
                seen.append(text)
    return "; ".join(seen)


def build(spec: RunSpec) -> tuple[TaskSettings, Task, dict[str, Any], Any]:
    """Settings, the prepared task, the variant's parameters and the model parts."""
    settings = task_settings(spec.task, spec.preset, spec.overrides)
    task = get_task(spec.task, settings.data, spec.seed)
    params = attention_params(spec.variant, spec.params, settings)
    parts = model_parts(task.model_kind, spec.variant, params, task.causal_self_attention,
                        settings.model.get("mixer", "attention"))
    return settings, task, params, parts


def unsupported_rows(spec: RunSpec, settings: TaskSettings, task: Task, params: dict[str, Any],
                     parts: Any) -> list[dict[str, Any]]:
    """The one row of a (task, variant) the task cannot run, with the reason."""
    return [{"task": spec.task, "variant": spec.variant, "label": label(spec.variant, params),
             "params": json.dumps(params, sort_keys=True), "seed": spec.seed,
             "preset": spec.preset, "model_kind": task.model_kind, "split": "-", "metric": "-",
             "condition": "", "status": "unsupported", "reason": parts.unsupported,
             "attention_parts": parts.description, "budget_x": settings.train.budget_x,
             "settings": settings.to_json()}]


def diverged_rows(spec: RunSpec, settings: TaskSettings, task: Task, params: dict[str, Any],
                  parts: Any, trainer: Trainer, model: nn.Module,
                  budget: dict[str, Any]) -> list[dict[str, Any]]:
    """The one row of a run whose training loss became NaN or inf: status ``diverged``, never
    ``ok``, and no metric (the weights are not evaluated)."""
    assert trainer.diverged is not None
    step, what = trainer.diverged
    progress = trainer.progress
    reason = (f"{what} at step {step} of {trainer.train.steps}; the run stopped there (its last "
              "sound checkpoint is kept)")
    return [{"task": spec.task, "variant": spec.variant, "label": label(spec.variant, params),
             "params": json.dumps(params, sort_keys=True), "seed": spec.seed,
             "preset": spec.preset, "model_kind": task.model_kind, "seq_len": task.seq_len,
             "split": "-", "metric": "-", "condition": "", "status": "diverged",
             "reason": reason, "attention_parts": parts.description, "steps": step,
             "best_step": progress.best_step, "train_time_s": progress.train_time_s,
             "peak_mem_bytes": progress.peak_mem_bytes, "param_count": _param_count(model),
             "kernel_path": _kernel_paths(model), "settings": settings.to_json(), **budget}]


def _model(spec: RunSpec, settings: TaskSettings, task: Task, parts: Any) -> nn.Module:
    """The task's model with ``parts``' attention, on the run's device."""
    sizes = {**task.model_overrides(), **settings.model}  # the preset may override the task
    return create_model(task.model_kind, "tiny", attention_kernel=spec.kernel, **parts.kwargs,
                        **sizes).to(spec.device)


def _budget(spec: RunSpec, settings: TaskSettings, task: Task, model: nn.Module
            ) -> tuple[TrainSettings, dict[str, Any]]:
    """The schedule to run and the budget columns of the rows: ``settings.train`` and the
    step's FLOPs for an equal-steps run; for ``train.budget_x``, the steps the budget buys
    (``bench.quality.budget``), counted against full attention's model on the same task."""
    train = settings.train
    flops: StepFlops = task_step_flops(model, task, train.batch_size, spec.device)
    if train.budget_x is None:
        return train, {"budget_x": None, "flop_budget": None, "flops_per_step": flops.total,
                       "train_flops": flops.total * train.steps}
    reference = flops
    if spec.variant != REFERENCE or spec.params:
        full = model_parts(task.model_kind, REFERENCE, attention_params(REFERENCE, {}, settings),
                           task.causal_self_attention)
        with torch.random.fork_rng(devices=[]):  # the run's own initialisation stays as it is
            reference = task_step_flops(_model(spec, settings, task, full), task,
                                        train.batch_size, spec.device)
    budget = matched_budget(train, flops.total, reference.total)
    return budget.train, budget.columns()


def train_run(spec: RunSpec, *, log: Callable[[str], None] = print,
              on_step: Callable[[int, float, float], None] | None = None) -> list[dict[str, Any]]:
    """Train (or resume), evaluate the best checkpoint on test, write and return the rows."""
    import_plugins(tuple(spec.plugins))
    with torch_threads(spec.threads):
        return _train_run(spec, log, on_step)


def _train_run(spec: RunSpec, log: Callable[[str], None],
               on_step: Callable[[int, float, float], None] | None) -> list[dict[str, Any]]:
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    settings, task, params, parts = build(spec)
    if parts.unsupported:
        rows = unsupported_rows(spec, settings, task, params, parts)
        atomic_write_json(out / METRICS, rows)
        return rows
    check_pretraining(task, settings.train)
    task.prepare()
    torch.manual_seed(spec.seed)
    model = _model(spec, settings, task, parts)
    schedule, budget = _budget(spec, settings, task, model)  # settings.train, or what a budget buys
    atomic_write_json(out / SETTINGS, {"run": spec.to_dict(), "settings": settings.to_dict(),
                                       "attention_params": params, "parts": parts.description,
                                       "schedule": asdict(schedule), "budget": budget})
    # the fingerprint and the rows keep the settings asked for; the trainer runs the schedule
    trainer = Trainer(spec, replace(settings, train=schedule), task, model,
                      _fingerprint(settings, spec, params), log)
    trainer.resume()
    trainer.run(on_step)
    recovery = "; ".join(trainer.recovery)
    if trainer.diverged is not None:
        rows = diverged_rows(spec, settings, task, params, parts, trainer, model, budget)
        atomic_write_json(out / METRICS, [{**row, "recovery": recovery} for row in rows])
        return rows
    tensors, _ = load_checkpoint(out / BEST)
    load_model_state(model, tensors)
    model.eval()
    metrics = {}
    with torch.no_grad(), trainer._autocast():
        for split in ("val", "test"):
            metrics[split] = task.evaluate(model, split, limit=None if split == "test" else
                                           settings.train.eval_examples,
                                           batch_size=settings.train.batch_size, final=split == "test")
    rows = _rows(spec, settings, task, params, parts, trainer.progress, metrics, model, budget)
    atomic_write_json(out / METRICS, [{**row, "recovery": recovery} for row in rows])
    return rows
