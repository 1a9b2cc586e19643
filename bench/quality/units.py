"""The units of a training grid: every (task, variant entry, seed) training run, each in a worker writing
``<out>/runs/<task>/<label>/seed<S>/``, the budget units, and every (task, reference) row."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.engine.cache import use_compile_cache
from bench.engine.config import safe_name
from bench.engine.process import Worker, WorkerGone, failure
from bench.quality.budget import budget_of, budget_overrides
from bench.quality.grid_config import GridConfig, GridVariant, canonical
from bench.quality.model_parts import always_causal, label
from bench.quality.reference import get_reference
from bench.quality.reference_unit import ReferenceUnit
from bench.quality.settings import attention_params, task_settings
from bench.quality.tasks import get_task
from bench.quality.train import RunSpec, train_run


def unit_id(spec: dict[str, Any]) -> str:
    """The id of a training run: what it trains, not where or with how many threads."""
    key = {k: spec[k] for k in ("task", "variant", "params", "preset", "seed", "kernel", "device")}
    if spec.get("overrides"):
        key["overrides"] = spec["overrides"]
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _run_dir_name(text: str) -> str:
    """A file-name-safe directory name for a label; a long one is cut and keeps a hash of itself."""
    name = safe_name(text)
    if len(name) < 80:
        return name
    return f"{name[:63]}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class TrainUnit:
    """One (task, variant entry, seed) training run of a grid, run in an isolated worker."""

    spec: dict[str, Any]  # a bench.quality.train.RunSpec as a dict
    timeout_s: float
    role: str = "variant"
    title: str = ""
    #: the variant's parameters in this task (the preset's shared ones filled in)
    attention_params: dict[str, Any] = field(default_factory=dict)

    @property
    def unit_id(self) -> str:
        return unit_id(self.spec)

    @property
    def device(self) -> str:
        return str(self.spec["device"])

    @property
    def label(self) -> str:
        return label(self.spec["variant"], self.attention_params, self.spec["overrides"])

    def describe(self) -> str:
        s = self.spec
        return f"train {s['task']} {self.label} seed {s['seed']} ({s['preset']})"

    def _identity(self) -> dict[str, Any]:
        """The columns every row of this unit carries, whatever the worker returned."""
        overrides = self.spec["overrides"]
        return {"unit_id": self.unit_id, "label": self.label, "role": self.role,
                "title": self.title, "overrides": canonical(overrides) if overrides else ""}

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        s = self.spec
        return [{**self._identity(), "task": s["task"], "variant": s["variant"],
                 "params": json.dumps(self.attention_params, sort_keys=True), "seed": s["seed"],
                 "preset": s["preset"], "split": "-", "metric": "-", "condition": "",
                 "status": status, "reason": reason, "budget_x": budget_of(s["overrides"])}]

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]:
        """Train in a fresh worker; a death or timeout becomes a row (the checkpoint stays)."""
        worker = Worker(train_worker_main, (self.spec, cuda_visible))
        try:
            kind, payload = worker.receive(self.timeout_s)
        except TimeoutError:
            return self.failure_rows("timeout", f"timed out after {self.timeout_s:g} s (the last "
                                                "checkpoint is kept: rerun to resume)")
        except WorkerGone as gone:
            return self.failure_rows(gone.status, gone.reason)
        finally:
            worker.kill()
        if kind == "failed":
            return self.failure_rows(payload[0], payload[1])
        identity = self._identity()
        return [{**row, **identity} for row in payload]


def train_worker_main(spec: dict[str, Any], cuda_visible: str | None, conn: Any) -> None:
    """Entry point of a training worker: train, then send the rows (or the failure)."""
    if cuda_visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible
    use_compile_cache(spec["device"])
    try:
        rows = train_run(RunSpec(**spec), log=lambda _: None)
    except Exception as err:  # no address-space cap on a training worker
        conn.send(("failed", failure(err, spec["device"])))
        return
    conn.send(("rows", rows))


class SettingsCache:
    """Task settings of one preset by (task, overrides), each preset read once per call."""

    def __init__(self, preset: str) -> None:
        self.preset = preset
        self.found: dict[tuple[str, str], Any] = {}

    def __call__(self, task: str, overrides: dict[str, Any]) -> Any:
        key = (task, canonical(overrides))
        if key not in self.found:
            self.found[key] = task_settings(task, self.preset, overrides)
        return self.found[key]


def units(config: GridConfig, out: Path) -> list[TrainUnit]:
    """Every unit, every task's first seed first."""
    seeds = dict(config.seeds)
    rounds = max(len(s) for s in seeds.values())
    settings = SettingsCache(config.preset)
    found = []
    for round_index in range(rounds):
        for task in config.tasks:
            if round_index >= len(seeds[task]):
                continue
            seed = seeds[task][round_index]
            for variant in config.variants:
                if not trains(config, task, variant):
                    continue
                params = attention_params(variant.name, dict(variant.params),
                                          settings(task, variant.overrides))
                name = label(variant.name, params, variant.overrides)
                spec = {"task": task, "variant": variant.name, "params": dict(variant.params),
                        "preset": config.preset, "seed": seed,
                        "out": str(out / "runs" / task / _run_dir_name(name) / f"seed{seed}"),
                        "device": config.device, "threads": config.threads,
                        "kernel": config.kernel, "overrides": variant.overrides,
                        "plugins": list(config.plugins)}
                found.append(TrainUnit(spec, config.timeout_s, variant.role, variant.title,
                                       params))
    return [*reference_units(config), *found, *_budget_units(config, found)]


def same_model_as_full(config: GridConfig, task: str, variant: GridVariant) -> bool:
    """True for the ``causal`` entry on a decoder-only task when the grid also trains ``full`` with the same model
    and training settings: one model, trained once as ``full``."""
    if variant.name != "causal" or variant.params:
        return False
    if not always_causal(_model_kind(config.preset, task)):
        return False
    return any(other.name == "full" and not other.params and other.overrides == variant.overrides
               and other.trains_on(task) for other in config.variants)


def trains(config: GridConfig, task: str, variant: GridVariant) -> bool:
    """Whether ``variant`` has units on ``task`` (not a second copy of full attention in a decoder)."""
    return variant.trains_on(task) and not same_model_as_full(config, task, variant)


def _model_kind(preset: str, task: str) -> str:
    settings = task_settings(task, preset)
    return get_task(task, settings.data, 0).model_kind  # (built, its data not loaded)


def reference_units(config: GridConfig) -> list[ReferenceUnit]:
    """One unit per (task, reference that applies to it); none under ``--variant``."""
    if config.only is not None:
        return []
    seeds, found = dict(config.seeds), []
    for task in config.tasks:
        settings = task_settings(task, config.preset)
        built = get_task(task, settings.data, 0)
        for name in config.references:
            if get_reference(name).applies(built):
                found.append(ReferenceUnit(task, name, config.preset, settings.data,
                                           settings.to_json(), seeds[task][0], config.timeout_s,
                                           config.device))
    return found


def _budget_units(config: GridConfig, found: list[TrainUnit]) -> list[TrainUnit]:
    """Every unit of a ``budgets.tasks`` task again at each ``budgets.x``, in ``../budget<x>x/seed<S>/``."""
    extra = []
    for unit in found:
        if unit.spec["task"] not in config.budget_tasks:
            continue
        for x in config.budget_x:
            run_dir, overrides = Path(unit.spec["out"]), dict(unit.spec["overrides"])
            overrides["train"] = {**overrides.get("train", {}), **budget_overrides(x)["train"]}
            spec = {**unit.spec, "overrides": overrides,
                    "out": str(run_dir.parent / f"budget{x:g}x" / run_dir.name)}
            extra.append(dataclasses.replace(unit, spec=spec))
    return extra
