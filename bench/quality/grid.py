"""Training grids: tasks x variants x seeds from a YAML config, run by ``attn-bench sweep``
through the same executors, worker isolation, resume and failure rows as speed sweeps.

Config keys: ``name``, ``kind: quality``, ``preset`` (a task preset, ``small`` or ``lra``),
``tasks`` (names), ``variants`` (``{name, <params>}``; task presets add their shared
attention settings such as the window), ``seeds`` (a list, or ``{default: [...], <task>:
[...]}``), ``device``, ``threads``, ``timeout_s`` (per training run), ``kernel``,
``references`` (``all`` or names: the reference rows without attention computed on each task
they apply to, one unit per (task, reference): bench/quality/reference_unit.py; with them
``variants`` may be empty).

A variant entry may also carry ``tasks`` (the grid tasks it trains on, default all),
``model`` (model settings overriding the preset's for this
entry only, e.g. ``{position: none}``), ``role`` (``variant``, the default; ``control``: an
ablation such as an order-blind model; ``reference``: a model without attention such as
``model: {mixer: lstm}``; both shown apart in the report) and ``title`` (a
short description, e.g. ``order-blind``). The overrides are part of the unit's identity, its
run directory and its label: ``full [position=none]``.

Each (task, variant entry, seed) is one unit: a worker process trains it (resuming from its
own checkpoint after a kill) in ``<out>/runs/<task>/<label>/seed<S>/`` and returns its rows;
the driver appends them to ``quality.csv``. A unit whose rows were trained with other task
settings than the preset (with the entry's overrides) gives now is not done: its rows move to
``superseded.csv`` and it trains again (the checkpoint of other settings is not resumed).
Rows of a (variant, params, overrides) the config no longer lists move to
``superseded.csv`` too, so the report only shows what the config asks for. The resolved
settings of every task are written beside the results (``grid.json``), with the config
itself (``grid.yaml``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

from attn import attention_info, list_attention
from attn.validation import require_int
from bench.engine.config import ConfigError, import_plugins, safe_name
from bench.engine.executors import Executor
from bench.engine.fsutil import atomic_write_text
from bench.engine.process import Worker, WorkerGone, failure
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.engine.rundir import Chain, RunRecorder, run_units
from bench.quality.budget import budget_of, budget_overrides, parse_budgets, strip_budget
from bench.quality.model_parts import label
from bench.quality.reference import get_reference, reference_names
from bench.quality.reference_unit import ReferenceUnit
from bench.quality.settings import attention_params, list_presets, settings_that_apply, task_settings
from bench.quality.tasks import get_task, list_tasks
from bench.quality.train import RunSpec, train_run

QUALITY_FILE = "quality.csv"
SUPERSEDED_FILE = "superseded.csv"  # rows of units whose task settings have since changed
ROLES = ("variant", "control", "reference")
#: keys of a variant entry that are not attention parameters
_ENTRY_KEYS = ("name", "model", "role", "title", "tasks")
#: model-config fields a grid entry may not override (the attention is the entry's own)
_NOT_MODEL = ("attention", "attention_params", "attention_kernel")
_KEYS = {"name", "kind", "description", "preset", "tasks", "variants", "seeds", "device",
         "threads", "timeout_s", "kernel", "plugins", "budgets", "references"}


@dataclass(frozen=True)
class GridVariant:
    """One variant entry of a grid: the attention, its explicit parameters, model-setting
    overrides, and whether it is a variant or a control (a reference row)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    model: tuple[tuple[str, Any], ...] = ()
    role: str = "variant"
    title: str = ""
    #: the grid tasks this entry trains on (None: every task of the grid)
    tasks: tuple[str, ...] | None = None

    def trains_on(self, task: str) -> bool:
        """Whether this entry has a unit on ``task``."""
        return self.tasks is None or task in self.tasks

    @property
    def overrides(self) -> dict[str, Any]:
        """The task-settings overrides of this entry (``{"model": {...}}`` or ``{}``)."""
        return {"model": dict(self.model)} if self.model else {}

    @property
    def identity(self) -> str:
        """What makes two entries the same training run (not the role or title)."""
        return _canonical([self.name, dict(self.params), self.overrides])


@dataclass(frozen=True)
class GridConfig:
    """A validated training grid."""

    name: str
    preset: str
    tasks: tuple[str, ...]
    variants: tuple[GridVariant, ...]
    seeds: tuple[tuple[str, tuple[int, ...]], ...]  # per task
    device: str = "cpu"
    threads: int | None = None
    timeout_s: float = 1800.0
    kernel: str = "auto"
    plugins: tuple[str, ...] = ()
    #: variant names a command line selected (``--variant``): rows of the others are left alone
    only: tuple[str, ...] | None = None
    budget_tasks: tuple[str, ...] = ()  # `budgets: {tasks, x}`: also trained at matched FLOPs
    budget_x: tuple[float, ...] = ()
    #: reference rows without attention computed on each task they apply to (``references``)
    references: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def only_tasks(config: GridConfig, tasks: Collection[str]) -> GridConfig:
    """``config`` restricted to ``tasks`` (a command line's ``--task``): a grid run in pieces.
    The rows of the grid's other tasks are neither trained nor judged (superseded or foreign
    units are looked for among the kept tasks only)."""
    unknown = [t for t in tasks if t not in config.tasks]
    if unknown:
        raise ConfigError(f"--task: unknown value {unknown[0]!r}; allowed values are the grid's "
                          f"tasks {list(config.tasks)}", "task")
    return dataclasses.replace(config, tasks=tuple(t for t in config.tasks if t in tasks),
                               budget_tasks=tuple(t for t in config.budget_tasks if t in tasks))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


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


def _check_model(where: str, name: str, params: dict[str, Any], model: Any, preset: str,
                 tasks: list[str]) -> None:
    """Model overrides of a variant entry: a mapping of fields every task's model has, with
    values its model config accepts."""
    from models.config import ModelConfig
    from models.registration import MODELS
    from models.registry import model_config

    if not isinstance(model, dict):
        raise ConfigError(f"config key {where!r}: must be a mapping of model settings like "
                          f"{{position: none}}; got {model!r}", where)
    for task in tasks:
        settings = task_settings(task, preset)
        kind = get_task(task, settings.data, 0).model_kind  # (built, its data not loaded)
        config_cls = MODELS[kind].config_cls if kind in MODELS else ModelConfig
        allowed = sorted({f.name for f in fields(config_cls)} - set(_NOT_MODEL))
        for key in model:
            if key not in allowed:
                raise ConfigError(f"config key '{where}.{key}': not a model setting of task "
                                  f"{task!r} ({kind}); allowed are {allowed}", f"{where}.{key}")
        merged = {**settings.model, **model}
        try:
            model_config(kind, "tiny", attention=name,
                         attention_params=attention_params(name, params, settings), **merged)
        except (ValueError, TypeError) as err:
            field_name = str(err).split(":", 1)[0]
            if field_name in model:  # a bad override; other complaints wait for the task's data
                raise ConfigError(f"config key '{where}.{field_name}': {err} (task {task!r})",
                                  f"{where}.{field_name}") from err


def _variant(index: int, item: Any, preset: str, tasks: list[str]) -> GridVariant:
    """One validated variant entry (see the module docstring)."""
    where = f"variants[{index}]"
    item = {"name": item} if isinstance(item, str) else item
    if not isinstance(item, dict) or item.get("name") not in list_attention():
        raise ConfigError(f"config key {where!r}: must name a registered variant "
                          f"{list_attention()}; got {item!r}", where)
    name = item["name"]
    params = {k: v for k, v in item.items() if k not in _ENTRY_KEYS}
    allowed = attention_info(name).params
    for key in params:
        if key not in allowed:
            raise ConfigError(f"config key '{where}.{key}': unknown parameter for {name!r}; "
                              f"allowed are {sorted(allowed)} and the entry keys "
                              f"{sorted(set(_ENTRY_KEYS) - {'name'})}", f"{where}.{key}")
    role = item.get("role", "variant")
    if role not in ROLES:
        raise ConfigError(f"config key '{where}.role': unknown value {role!r}; allowed values "
                          f"are {sorted(ROLES)}", f"{where}.role")
    title = item.get("title", "")
    if not isinstance(title, str):
        raise ConfigError(f"config key '{where}.title': must be a string; got {title!r}",
                          f"{where}.title")
    only_tasks = item.get("tasks")
    if only_tasks is not None and (not isinstance(only_tasks, list) or not only_tasks
                                   or any(t not in tasks for t in only_tasks)):
        raise ConfigError(f"config key '{where}.tasks': must be a non-empty list of the grid's "
                          f"tasks {tasks}; got {only_tasks!r}", f"{where}.tasks")
    model = item.get("model", {})
    if model != {}:
        _check_model(f"{where}.model", name, params, model, preset, only_tasks or tasks)
    return GridVariant(name=name, params=tuple(sorted(params.items())),
                       model=tuple(sorted(model.items())), role=role, title=title,
                       tasks=None if only_tasks is None else tuple(only_tasks))


def parse_grid(raw: dict[str, Any], only: Collection[str] | None = None) -> GridConfig:
    """Validate a training-grid mapping; errors name the key and the allowed values.

    ``only``: the variant names to run (a command line's ``--variant``); every entry is still
    validated, and the rows of the other variants are left alone when the grid runs."""
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
    if not isinstance(raw["variants"], list):
        raise ConfigError(f"config key 'variants': must be a list like [{{name: full}}]; got "
                          f"{raw['variants']!r}", "variants")
    variants: list[GridVariant] = []
    for index, item in enumerate(raw["variants"]):
        variant = _variant(index, item, raw["preset"], tasks)
        for earlier, other in enumerate(variants):
            if other.identity == variant.identity:
                raise ConfigError(f"config key 'variants[{index}]': the same training run as "
                                  f"variants[{earlier}] (name, parameters and model settings "
                                  "alike); give it other settings or remove it",
                                  f"variants[{index}]")
        variants.append(variant)
    if not variants and not raw.get("references"):
        raise ConfigError("config key 'variants': must be a non-empty list like [{name: full}] "
                          "(or empty beside a 'references' list: a grid of references only)",
                          "variants")
    if only is not None:
        names = sorted({v.name for v in variants})
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"--variant: {unknown[0]!r} is not a variant of the grid; its "
                              f"variants are {names}", "variants")
        variants = [v for v in variants if v.name in only]
        raw = {**raw, "variants": [item for item in raw["variants"]
                                   if (item if isinstance(item, str) else item["name"]) in only]}
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
    budget_tasks, budget_x = parse_budgets(raw.get("budgets"), tuple(tasks))
    references = _references(raw.get("references", []))
    return GridConfig(name=str(raw["name"]), preset=raw["preset"], tasks=tuple(tasks),
                      variants=tuple(variants), seeds=_seeds(raw.get("seeds", [0]), tuple(tasks)),
                      device=device, threads=threads, timeout_s=float(timeout),
                      kernel=str(raw.get("kernel", "auto")), plugins=tuple(plugins),
                      only=None if only is None else tuple(sorted(set(only))),
                      budget_tasks=budget_tasks, budget_x=budget_x, references=references,
                      raw=raw)


def _references(raw: Any) -> tuple[str, ...]:
    """The ``references`` key: ``all`` or a list of reference names (bench/quality/reference)."""
    names = reference_names()
    if raw == "all":
        return tuple(names)
    if not isinstance(raw, list) or any(not isinstance(n, str) for n in raw):
        raise ConfigError(f"config key 'references': must be 'all' or a list of reference names "
                          f"from {names}; got {raw!r}", "references")
    unknown = [n for n in raw if n not in names]
    if unknown:
        raise ConfigError(f"config key 'references': unknown reference {unknown[0]!r}; allowed "
                          f"values are 'all' or names from {names}", "references")
    return tuple(dict.fromkeys(raw))


def unit_id(spec: dict[str, Any]) -> str:
    """The id of a training run: what it trains, not where or with how many threads. A run
    without settings overrides keeps the id it had before grids could give overrides."""
    key = {k: spec[k] for k in ("task", "variant", "params", "preset", "seed", "kernel", "device")}
    if spec.get("overrides"):
        key["overrides"] = spec["overrides"]
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _run_dir_name(text: str) -> str:
    """A file-name-safe directory name for a label; a label too long to keep whole keeps a
    hash of itself, so two long labels never share a directory."""
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
                "title": self.title, "overrides": _canonical(overrides) if overrides else ""}

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

    try:
        rows = train_run(RunSpec(**spec), log=lambda _: None)
    except Exception as err:  # no address-space cap on a training worker
        conn.send(("failed", failure(err, spec["device"])))
        return
    conn.send(("rows", rows))


class _SettingsCache:
    """Task settings of one preset by (task, overrides), each preset read once per call."""

    def __init__(self, preset: str) -> None:
        self.preset = preset
        self.found: dict[tuple[str, str], Any] = {}

    def __call__(self, task: str, overrides: dict[str, Any]) -> Any:
        key = (task, _canonical(overrides))
        if key not in self.found:
            self.found[key] = task_settings(task, self.preset, overrides)
        return self.found[key]


def units(config: GridConfig, out: Path) -> list[TrainUnit]:
    """Every (task, variant entry, seed) unit: every task's first seed first (task by task,
    variant by variant), then every task's second seed, and so on, so a grid stopped part-way
    has covered every (task, variant) before it repeats any."""
    seeds = dict(config.seeds)
    rounds = max(len(s) for s in seeds.values())
    settings = _SettingsCache(config.preset)
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
    """True for the ``causal`` entry on a decoder-only task when the grid also has ``full``
    with the same model settings: a decoder runs every self-attention causally, so the two
    are one model (bit-identical runs); the grid trains it once, as ``full``."""
    if variant.name != "causal" or variant.params:
        return False
    if _model_kind(config.preset, task) != "decoder_lm":
        return False
    return any(other.name == "full" and not other.params and other.model == variant.model
               and other.trains_on(task) for other in config.variants)


def trains(config: GridConfig, task: str, variant: GridVariant) -> bool:
    """Whether ``variant`` has units on ``task`` (its ``tasks``, and not a second copy of
    full attention in a decoder)."""
    return variant.trains_on(task) and not same_model_as_full(config, task, variant)


def _model_kind(preset: str, task: str) -> str:
    settings = task_settings(task, preset)
    return get_task(task, settings.data, 0).model_kind  # (built, its data not loaded)


def reference_units(config: GridConfig) -> list[ReferenceUnit]:
    """One unit per (task, reference of the grid that applies to it), on the task's preset
    data settings; none when a command line selected variants (``--variant``)."""
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


def is_reference_row(row: dict[str, Any]) -> bool:
    """A row of a reference unit (not of a trained entry with role ``reference``)."""
    return row.get("role") == "reference" and row.get("variant") in reference_names()


def _budget_units(config: GridConfig, found: list[TrainUnit]) -> list[TrainUnit]:
    """Every unit of a ``budgets.tasks`` task again at each ``budgets.x``, after all the
    equal-steps units, in ``<its run dir>/../budget<x>x/seed<S>/`` with the budget added to
    its settings overrides (bench/quality/budget.py)."""
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


def _row_json(row: dict[str, Any], column: str) -> Any:
    """A JSON column of a row (empty: ``{}``); ``ValueError`` when it does not parse."""
    text = row.get(column) or "{}"
    return json.loads(text)


def superseded_units(rows: list[dict[str, Any]], config: GridConfig) -> set[str]:
    """Units whose recorded rows were trained with other task settings than the grid's preset
    gives now, with the unit's own overrides (the preset was edited since): they are not
    done, they run again."""
    now = _SettingsCache(config.preset)
    stale = set()
    for row in rows:
        if not row.get("settings") or row.get("task") not in config.tasks:
            continue
        if is_reference_row(row):  # a reference reads the data settings only
            recorded = json.loads(row["settings"]).get("data")
            if _canonical(recorded) != _canonical(now(row["task"], {}).data):
                stale.add(row["unit_id"])
            continue
        try:
            expected = now(row["task"], _row_json(row, "overrides")).to_json()
        except (ValueError, ConfigError):
            continue  # overrides no entry gives any more: foreign_units moves them
        params = _row_json(row, "params") or {}
        if (settings_that_apply(row["settings"], row.get("variant", ""), params)
                != settings_that_apply(expected, row.get("variant", ""), params)):
            stale.add(row["unit_id"])
    return stale


def foreign_units(rows: list[dict[str, Any]], config: GridConfig) -> set[str]:
    """Units of the grid's tasks whose (variant, parameters, overrides) no entry of the config
    gives any more (the entry was edited or removed): their rows would mix into the report
    as if the config still asked for them. Variants a command line left out (``only``) and
    tasks the config does not list are left alone."""
    wanted: dict[str, set[tuple[str, str, str]]] = {}
    settings_of = _SettingsCache(config.preset)
    for task in config.tasks:
        wanted[task] = set()
        for variant in config.variants:
            if not trains(config, task, variant):
                continue
            settings = settings_of(task, variant.overrides)
            overrides = _canonical(variant.overrides)
            for params in (dict(variant.params),  # failure rows of earlier versions
                           attention_params(variant.name, dict(variant.params), settings)):
                wanted[task].add((variant.name, _canonical(params), overrides))
    foreign = set()
    for row in rows:
        if row.get("task") not in wanted or (config.only is not None
                                             and row.get("variant") not in config.only):
            continue
        if is_reference_row(row):
            if row["variant"] not in config.references:
                foreign.add(row["unit_id"])
            continue
        try:
            budgets = config.budget_x if row["task"] in config.budget_tasks else ()
            key = (row["variant"], _canonical(_row_json(row, "params")),
                   _canonical(strip_budget(_row_json(row, "overrides"), budgets)))
        except ValueError:
            continue  # unreadable: not ours to judge
        if key not in wanted[row["task"]]:
            foreign.add(row["unit_id"])
    return foreign


def resolved_settings(config: GridConfig) -> dict[str, Any]:
    """Every task's settings in this grid's preset (written beside the results)."""
    return {"grid": {k: v for k, v in config.raw.items()},
            "tasks": {t: task_settings(t, config.preset).to_dict()
                      for t in config.raw.get("tasks", config.tasks)}}  # all, also for --task


@dataclass(frozen=True)
class GridPlan:
    """The run plan (:class:`bench.engine.rundir.RunPlan`) of a training grid: its units
    (:func:`units`), each a chain of its own, into ``quality.csv``."""

    config: GridConfig

    file: ClassVar[str] = QUALITY_FILE
    columns: ClassVar[list[str]] = QUALITY_COLUMNS
    config_file: ClassVar[str] = "grid.json"
    dtype: ClassVar[str] = "float32"

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def threads(self) -> int | None:
        return self.config.threads

    def key(self, row: dict[str, Any]) -> tuple:
        return (row["unit_id"], row["split"], row["metric"], row["condition"])

    def settings(self) -> dict[str, Any]:
        return resolved_settings(self.config)

    def chains(self, recorder: RunRecorder) -> list[Chain]:
        """The units not recorded yet; rows trained with other settings, or of entries the
        config no longer gives, move to ``superseded.csv`` first (their units run again)."""
        stale = (superseded_units(recorder.kept, self.config)
                 | foreign_units(recorder.kept, self.config))
        recorder.supersede(lambda row: row["unit_id"] in stale, SUPERSEDED_FILE)
        done = {r["unit_id"] for r in recorder.kept}
        return [_single(u) for u in units(self.config, recorder.run_dir) if u.unit_id not in done]

    def begin(self, run_dir: Path, env: dict[str, Any]) -> None:
        """Write the config itself beside the results (``grid.yaml``)."""
        atomic_write_text(run_dir / "grid.yaml", yaml.safe_dump(self.config.raw, sort_keys=False))


def run_grid(config: GridConfig, out: Path, *, executor: Executor | None = None,
             allow_mixed: bool = False, retry_failed: bool = False, overwrite: bool = False,
             on_start: Callable[[Any], None] | None = None,
             on_done: Callable[[Any, list[dict[str, Any]]], None] | None = None) -> list[dict]:
    """Train every unfinished unit of ``config`` into ``out``; returns the new rows."""
    return run_units(out, GridPlan(config), executor=executor, allow_mixed=allow_mixed,
                     retry_failed=retry_failed, overwrite=overwrite, on_start=on_start,
                     on_done=on_done)


def _single(unit: TrainUnit) -> Generator[TrainUnit, Any, None]:
    """A chain of one unit (training runs do not depend on each other)."""
    yield unit
