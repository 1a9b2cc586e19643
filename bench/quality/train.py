"""One training run (a variant on a task with a preset and a seed) into its directory: ``settings.json``, the
checkpoints, and ``metrics.json``, the rows of its best checkpoint evaluated once on test."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attn import Attention
from bench.engine.config import import_plugins
from bench.engine.fsutil import atomic_write_json
from bench.engine.threads import torch_threads
from bench.quality.budget import REFERENCE, StepFlops, matched_budget, task_step_flops
from bench.quality.checkpoint import load_checkpoint, load_model_state
from bench.quality.model_parts import label, model_parts
from bench.quality.pretrain import check_pretraining
from bench.quality.run_spec import RunSpec
from bench.quality.settings import (
    MODEL_SIZE,
    TaskSettings,
    TrainSettings,
    attention_params,
    task_settings,
)
from bench.quality.state import state_columns
from bench.quality.tasks import Metric, Task, get_task
from bench.quality.trainer import BEST, Progress, Trainer
from models import create_model

METRICS, SETTINGS = "metrics.json", "settings.json"


def _fingerprint(settings: TaskSettings, spec: RunSpec, params: dict[str, Any]) -> str:
    """What a checkpoint must match to be resumed (not where it lives or how many threads)."""
    key = {"settings": settings.to_dict(), "task": spec.task, "variant": spec.variant,
           "params": params, "seed": spec.seed, "kernel": spec.kernel}
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _run_columns(spec: RunSpec, task: Task, params: dict[str, Any]) -> dict[str, Any]:
    """The first columns of every row of a run: which run it is."""
    return {"task": spec.task, "variant": spec.variant, "label": label(spec.variant, params),
            "params": json.dumps(params, sort_keys=True), "seed": spec.seed, "preset": spec.preset,
            "model_kind": task.model_kind}


def _rows(spec: RunSpec, settings: TaskSettings, task: Task, params: dict[str, Any], parts: Any,
          progress: Progress, metrics: dict[str, list[Metric]], model: nn.Module,
          budget: dict[str, Any]) -> list[dict]:
    common = {
        **_run_columns(spec, task, params), "seq_len": task.seq_len,
        "attention_parts": parts.description, "status": "ok", "reason": "",
        "steps": progress.step, "best_step": progress.best_step,
        "train_time_s": progress.train_time_s,
        "train_tokens_per_s": progress.tokens / progress.train_time_s if progress.train_time_s else None,
        "peak_mem_bytes": progress.peak_mem_bytes, "param_count": _param_count(model),
        "kernel_path": _kernel_paths(model),
        "settings": settings.to_json(), **budget,
        **state_columns(spec.task, task.seq_len, model),  # recall tasks: what a layer keeps to answer
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
    return [{**_run_columns(spec, task, params), "split": "-", "metric": "-", "condition": "",
             "status": "unsupported", "reason": parts.unsupported, "attention_parts": parts.description,
             "budget_x": settings.train.budget_x, "settings": settings.to_json()}]


def diverged_rows(spec: RunSpec, settings: TaskSettings, task: Task, params: dict[str, Any],
                  parts: Any, trainer: Trainer, model: nn.Module,
                  budget: dict[str, Any]) -> list[dict[str, Any]]:
    """The one row of a run that diverged: status ``diverged``, no metric (weights not evaluated)."""
    assert trainer.diverged is not None
    step, what = trainer.diverged
    progress = trainer.progress
    reason = (f"{what} at step {step} of {trainer.train.steps}; the run stopped there (its last "
              "sound checkpoint is kept)")
    return [{**_run_columns(spec, task, params), "seq_len": task.seq_len, "split": "-", "metric": "-",
             "condition": "", "status": "diverged", "reason": reason, "attention_parts": parts.description,
             "steps": step, "best_step": progress.best_step, "train_time_s": progress.train_time_s,
             "peak_mem_bytes": progress.peak_mem_bytes, "param_count": _param_count(model),
             "kernel_path": _kernel_paths(model), "settings": settings.to_json(), **budget}]


def _model(spec: RunSpec, settings: TaskSettings, task: Task, parts: Any) -> nn.Module:
    """The task's model with ``parts``' attention, on the run's device."""
    sizes = {**task.model_overrides(), **settings.model}  # the preset may override the task
    return create_model(task.model_kind, MODEL_SIZE, attention_kernel=spec.kernel, **parts.kwargs,
                        **sizes).to(spec.device)


def _budget(spec: RunSpec, settings: TaskSettings, task: Task, model: nn.Module
            ) -> tuple[TrainSettings, dict[str, Any]]:
    """The schedule to run and the rows' budget columns (``train.budget_x``: against full attention's model)."""
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
        rows = [{**row, "recovery": recovery} for row in
                diverged_rows(spec, settings, task, params, parts, trainer, model, budget)]
        atomic_write_json(out / METRICS, rows)
        return rows
    tensors, _ = load_checkpoint(out / BEST)
    load_model_state(model, tensors)
    model.eval()
    metrics = {}
    with torch.no_grad(), trainer.autocast():
        for split in ("val", "test"):
            metrics[split] = task.evaluate(model, split, limit=None if split == "test" else
                                           settings.train.eval_examples,
                                           batch_size=settings.train.batch_size, final=split == "test")
    rows = [{**row, "recovery": recovery} for row in
            _rows(spec, settings, task, params, parts, trainer.progress, metrics, model, budget)]
    atomic_write_json(out / METRICS, rows)  # the rows returned, as they are saved
    return rows
