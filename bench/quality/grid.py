"""Training grids: tasks x variants x seeds from a YAML config, run by ``attn-bench sweep``
through the same executors, worker isolation, resume and failure rows as speed sweeps.

Config keys: ``name``, ``kind: quality``, ``preset`` (a task preset, ``small`` or ``lra``),
``tasks`` (names), ``variants`` (``{name, <params>}``; task presets add their shared
attention settings such as the window), ``seeds`` (a list, or ``{default: [...], <task>:
[...]}``), ``device``, ``threads``, ``timeout_s`` (per training run), ``kernel``.

Each (task, variant, seed) is one unit: a worker process trains it (resuming from its own
checkpoint after a kill) in ``<out>/runs/<task>/<variant>/seed<S>/`` and returns its rows;
the driver appends them to ``quality.csv``. A unit whose rows were trained with other task
settings than the preset holds now is not done: its rows move to ``superseded.csv`` and it
trains again (the checkpoint of other settings is not resumed). The resolved settings of
every task are written beside the results (``grid.json``), with the config itself
(``grid.yaml``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attn import attention_info, list_attention
from attn.validation import require_int
from bench.config import ConfigError, import_plugins, safe_name
from bench.executors import LocalExecutor
from bench.fsutil import RunLock, atomic_write_text
from bench.process import Worker, WorkerGone
from bench.provenance import ROW_FIELDS, environment
from bench.quality.model_parts import label
from bench.quality.settings import list_presets, task_settings
from bench.quality.tasks import list_tasks
from bench.quality.train import RunSpec, train_run
from bench.rundir import RunRecorder
from bench.schedule import drive
from bench.sweep import check_device
from bench.worker import failure

QUALITY_FILE = "quality.csv"
SUPERSEDED_FILE = "superseded.csv"  # rows of units whose task settings have since changed
QUALITY_COLUMNS = [
    "unit_id", "task", "variant", "label", "params", "seed", "preset", "split", "metric",
    "condition", "value", "status", "reason", "steps", "best_step", "train_time_s",
    "train_tokens_per_s", "eval_tokens_per_s", "peak_mem_bytes", "param_count", "seq_len",
    "model_kind", "attention_parts", "kernel_path", "settings", "threads", *ROW_FIELDS,
]
_KEYS = {"name", "kind", "description", "preset", "tasks", "variants", "seeds", "device",
         "threads", "timeout_s", "kernel", "plugins"}


@dataclass(frozen=True)
class GridConfig:
    """A validated training grid."""

    name: str
    preset: str
    tasks: tuple[str, ...]
    variants: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    seeds: tuple[tuple[str, tuple[int, ...]], ...]  # per task
    device: str = "cpu"
    threads: int | None = None
    timeout_s: float = 1800.0
    kernel: str = "auto"
    plugins: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def is_grid(raw: Any) -> bool:
    """True for a training-grid config (``kind: quality``)."""
    return isinstance(raw, dict) and raw.get("kind") == "quality"


def _seeds(raw: Any, tasks: tuple[str, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    def check(key: str, value: Any) -> tuple[int, ...]:
        if (not isinstance(value, list) or not value
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)):
            raise ConfigError(f"config key {key!r}: must be a non-empty list of integers >= 0; "
                              f"got {value!r}", key)
        return tuple(value)

    if isinstance(raw, list):
        return tuple((t, check("seeds", raw)) for t in tasks)
    if not isinstance(raw, dict):
        raise ConfigError(f"config key 'seeds': must be a list or a mapping {{default: [...], "
                          f"<task>: [...]}}; got {raw!r}", "seeds")
    unknown = sorted(set(raw) - {"default", *tasks})
    if unknown:
        raise ConfigError(f"config key 'seeds.{unknown[0]}': not a task of the grid; allowed "
                          f"keys are {['default', *tasks]}", f"seeds.{unknown[0]}")
    default = check("seeds.default", raw.get("default", [0]))
    return tuple((t, check(f"seeds.{t}", raw[t]) if t in raw else default) for t in tasks)


def parse_grid(raw: dict[str, Any]) -> GridConfig:
    """Validate a training-grid mapping; errors name the key and the allowed values."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"config key {unknown[0]!r}: unknown key; allowed keys are {sorted(_KEYS)}",
                          unknown[0])
    for key in ("name", "preset", "tasks", "variants"):
        if key not in raw:
            raise ConfigError(f"config key {key!r}: is required", key)
    plugins = raw.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(f"config key 'plugins': must be a list of importable module names; got "
                          f"{plugins!r}", "plugins")
    import_plugins(tuple(plugins))
    if raw["preset"] not in list_presets():
        raise ConfigError(f"config key 'preset': unknown preset {raw['preset']!r}; presets are "
                          f"{list_presets()}", "preset")
    tasks = raw["tasks"]
    if not isinstance(tasks, list) or not tasks or any(t not in list_tasks() for t in tasks):
        raise ConfigError(f"config key 'tasks': must be a non-empty list of tasks from "
                          f"{list_tasks()}; got {tasks!r}", "tasks")
    variants = []
    for index, item in enumerate(raw["variants"] or []):
        item = {"name": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or item.get("name") not in list_attention():
            raise ConfigError(f"config key 'variants[{index}]': must name a registered variant "
                              f"{list_attention()}; got {item!r}", f"variants[{index}]")
        params = {k: v for k, v in item.items() if k != "name"}
        allowed = attention_info(item["name"]).params
        for key in params:
            if key not in allowed:
                raise ConfigError(f"config key 'variants[{index}].{key}': unknown parameter for "
                                  f"{item['name']!r}; allowed are {sorted(allowed)}",
                                  f"variants[{index}].{key}")
        variants.append((item["name"], tuple(sorted(params.items()))))
    if not variants:
        raise ConfigError("config key 'variants': must be a non-empty list like [{name: full}]",
                          "variants")
    device = raw.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"config key 'device': unknown value {device!r}; allowed values are "
                          "['cpu', 'cuda']", "device")
    threads = raw.get("threads")
    if threads is not None:
        require_int("config key 'threads'", threads, minimum=1, error=functools.partial(ConfigError, key="threads"))
    timeout = raw.get("timeout_s", 1800.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"config key 'timeout_s': must be a number > 0; got {timeout!r}", "timeout_s")
    return GridConfig(name=str(raw["name"]), preset=raw["preset"], tasks=tuple(tasks),
                      variants=tuple(variants), seeds=_seeds(raw.get("seeds", [0]), tuple(tasks)),
                      device=device, threads=threads, timeout_s=float(timeout),
                      kernel=str(raw.get("kernel", "auto")), plugins=tuple(plugins), raw=raw)


@dataclass(frozen=True)
class TrainUnit:
    """One (task, variant, seed) training run of a grid, run in an isolated worker."""

    spec: dict[str, Any]  # a bench.quality.train.RunSpec as a dict
    timeout_s: float

    @property
    def unit_id(self) -> str:
        key = {k: self.spec[k] for k in ("task", "variant", "params", "preset", "seed", "kernel",
                                          "device")}
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def device(self) -> str:
        return str(self.spec["device"])

    def describe(self) -> str:
        s = self.spec
        return f"train {s['task']} {label(s['variant'], s['params'])} seed {s['seed']} ({s['preset']})"

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        s = self.spec
        return [{"unit_id": self.unit_id, "task": s["task"], "variant": s["variant"],
                 "label": label(s["variant"], s["params"]),
                 "params": json.dumps(s["params"], sort_keys=True), "seed": s["seed"],
                 "preset": s["preset"], "split": "-", "metric": "-", "condition": "",
                 "status": status, "reason": reason}]

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
        return [{**row, "unit_id": self.unit_id} for row in payload]


def train_worker_main(spec: dict[str, Any], cuda_visible: str | None, conn: Any) -> None:
    """Entry point of a training worker: train, then send the rows (or the failure)."""
    if cuda_visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible

    try:
        rows = train_run(RunSpec(**spec), log=lambda _: None)
    except Exception as err:
        _, status, reason = failure(err, _NoCap())
        conn.send(("failed", (status, reason)))
        return
    conn.send(("rows", rows))


@dataclass(frozen=True)
class _NoCap:
    """What :func:`bench.worker.failure` reads of a case: no address-space cap here."""

    device: str = "cpu"
    max_memory_gb: float | None = None


def units(config: GridConfig, out: Path) -> list[TrainUnit]:
    """Every (task, variant, seed) unit: every task's first seed first (task by task, variant
    by variant), then every task's second seed, and so on, so a grid stopped part-way has
    covered every (task, variant) before it repeats any."""
    seeds = dict(config.seeds)
    rounds = max(len(s) for s in seeds.values())
    found = []
    for round_index in range(rounds):
        for task in config.tasks:
            if round_index >= len(seeds[task]):
                continue
            seed = seeds[task][round_index]
            for variant, params in config.variants:
                run_dir = out / "runs" / task / safe_name(label(variant, dict(params))) / f"seed{seed}"
                spec = {"task": task, "variant": variant, "params": dict(params),
                        "preset": config.preset, "seed": seed, "out": str(run_dir),
                        "device": config.device, "threads": config.threads,
                        "kernel": config.kernel, "overrides": {},
                        "plugins": list(config.plugins)}
                found.append(TrainUnit(spec, config.timeout_s))
    return found


def superseded_units(rows: list[dict[str, Any]], config: GridConfig) -> set[str]:
    """Units whose recorded rows were trained with other task settings than the grid's preset
    gives now (the preset was edited since): they are not done, they run again."""
    now = {t: task_settings(t, config.preset).to_json() for t in config.tasks}
    return {r["unit_id"] for r in rows
            if r.get("settings") and r.get("task") in now and r["settings"] != now[r["task"]]}


def resolved_settings(config: GridConfig) -> dict[str, Any]:
    """Every task's settings in this grid's preset (written beside the results)."""
    return {"grid": {k: v for k, v in config.raw.items()},
            "tasks": {t: task_settings(t, config.preset).to_dict() for t in config.tasks}}


def run_grid(config: GridConfig, out: Path, *, executor: Any = None, allow_mixed: bool = False,
             retry_failed: bool = False, overwrite: bool = False,
             on_start: Callable[[Any], None] | None = None,
             on_done: Callable[[Any, list[dict[str, Any]]], None] | None = None) -> list[dict]:
    """Train every unfinished unit of ``config`` into ``out``; returns the new rows."""
    check_device(config.device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out):
        recorder = RunRecorder(out, file=QUALITY_FILE, columns=QUALITY_COLUMNS,
                               key=lambda r: (r["unit_id"], r["split"], r["metric"], r["condition"]),
                               overwrite=overwrite, retry_failed=retry_failed)
        stale = superseded_units(recorder.kept, config)
        recorder.supersede(lambda row: row["unit_id"] in stale, SUPERSEDED_FILE)
        done = {r["unit_id"] for r in recorder.kept}
        todo = [u for u in units(config, out) if u.unit_id not in done]
        executor = executor or LocalExecutor(config.device)
        recorder.start(environment(config.device, config.threads), dtype="float32",
                       allow_mixed=allow_mixed, has_work=bool(todo),
                       config=resolved_settings(config), config_file="grid.json",
                       local=isinstance(executor, LocalExecutor))
        if not todo:
            executor.shutdown()
            return []
        atomic_write_text(out / "grid.yaml", yaml.safe_dump(config.raw, sort_keys=False))
        new_rows: list[dict[str, Any]] = []

        def done_unit(unit: Any, rows: list[dict[str, Any]]) -> None:
            recorder.record(rows)
            new_rows.extend(rows)
            if on_done is not None:
                on_done(unit, rows)

        try:
            drive([_single(u) for u in todo], executor, on_start=on_start, on_done=done_unit)
        finally:
            executor.shutdown()
        return new_rows


def _single(unit: TrainUnit) -> Generator[TrainUnit, Any, None]:
    """A chain of one unit (training runs do not depend on each other)."""
    yield unit
