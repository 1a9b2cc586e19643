"""Training-grid configs (docs/quality.md, "Grids"), validated into frozen dataclasses; a variant entry may
also carry ``tasks``, the grid tasks it trains on (default all)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any

from attn import attention_info, list_attention
from attn.validation import require_int
from bench.engine.config import ConfigError, plugin_modules
from bench.quality.budget import parse_budgets
from bench.quality.reference import reference_names
from bench.quality.settings import (
    MODEL_SIZE,
    attention_params,
    list_task_presets,
    preset_tasks,
    task_settings,
)
from bench.quality.tasks import list_tasks, task_info
from models.config import ModelConfig
from models.registration import MODELS
from models.registry import model_config

ROLES = ("variant", "control", "reference")
#: config keys a command line may override (``tasks``: :func:`only_tasks`; ``seeds``: :func:`only_seeds`)
OVERRIDES = ("variants", "tasks", "seeds", "device", "threads", "plugins")
#: keys of a variant entry that are not attention parameters
_ENTRY_KEYS = ("name", "model", "train", "role", "title", "tasks")
#: model-config fields a grid entry may not override (the attention is the entry's own)
_NOT_MODEL = ("attention", "attention_params", "attention_kernel")
_KEYS = {"name", "kind", "description", "preset", "tasks", "variants", "seeds", "device",
         "threads", "timeout_s", "kernel", "plugins", "budgets", "references"}


@dataclass(frozen=True)
class GridVariant:
    """One variant entry of a grid: the attention, its parameters, model and training overrides, role and title."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    model: tuple[tuple[str, Any], ...] = ()
    train: tuple[tuple[str, Any], ...] = ()  # e.g. a wider model's learning rate
    role: str = "variant"
    title: str = ""
    #: the grid tasks this entry trains on (None: every task of the grid)
    tasks: tuple[str, ...] | None = None

    def trains_on(self, task: str) -> bool:
        """Whether this entry has a unit on ``task``."""
        return self.tasks is None or task in self.tasks

    @property
    def overrides(self) -> dict[str, Any]:
        """The task-settings overrides of this entry (``{"model": {...}, "train": {...}}``, each only if set)."""
        return {section: dict(values) for section, values in (("model", self.model), ("train", self.train))
                if values}

    @property
    def identity(self) -> str:
        """What makes two entries the same training run (not the role or title)."""
        return canonical([self.name, dict(self.params), self.overrides])


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
    """``config`` restricted to ``tasks`` (``--task``); the other tasks' rows are neither trained nor judged."""
    unknown = [t for t in tasks if t not in config.tasks]
    if unknown:
        raise ConfigError(f"--task: unknown value {unknown[0]!r}; allowed values are the grid's "
                          f"tasks {list(config.tasks)}", "task")
    return dataclasses.replace(config, tasks=tuple(t for t in config.tasks if t in tasks),
                               budget_tasks=tuple(t for t in config.budget_tasks if t in tasks))


def only_seeds(config: GridConfig, seeds: Collection[int]) -> GridConfig:
    """``config`` restricted to ``seeds`` (``--seed``); the other seeds' rows stay as they are."""
    known = sorted({s for _, task_seeds in config.seeds for s in task_seeds})
    unknown = [s for s in seeds if s not in known]
    if unknown:
        raise ConfigError(f"--seed: unknown value {unknown[0]!r}; allowed values are the grid's "
                          f"seeds {known}", "seeds")
    kept = tuple((task, tuple(s for s in task_seeds if s in seeds)) for task, task_seeds in config.seeds)
    return dataclasses.replace(config, seeds=kept)


def canonical(value: Any) -> str:
    """``value`` as sorted JSON: equal settings give equal text (identities, cache keys)."""
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
    """Check a variant entry's model overrides against every task's model config."""
    if not isinstance(model, dict):
        raise ConfigError(f"config key {where!r}: must be a mapping of model settings like "
                          f"{{position: none}}; got {model!r}", where)
    for task in tasks:
        settings = task_settings(task, preset)
        kind = task_info(task).model_kind(settings.data)
        config_cls = MODELS[kind].config_cls if kind in MODELS else ModelConfig
        allowed = sorted({f.name for f in fields(config_cls)} - set(_NOT_MODEL))
        for key in model:
            if key not in allowed:
                raise ConfigError(f"config key '{where}.{key}': not a model setting of task "
                                  f"{task!r} ({kind}); allowed are {allowed}", f"{where}.{key}")
        merged = {**settings.model, **model}
        try:
            model_config(kind, MODEL_SIZE, attention=name,
                         attention_params=attention_params(name, params, settings), **merged)
        except (ValueError, TypeError) as err:
            field_name = str(err).split(":", 1)[0]
            if field_name in model:  # a bad override; other complaints wait for the task's data
                raise ConfigError(f"config key '{where}.{field_name}': {err} (task {task!r})",
                                  f"{where}.{field_name}") from err


def _check_train(where: str, train: Any, preset: str, tasks: list[str]) -> None:
    """Check a variant entry's training overrides (the grid's ``budgets`` own ``budget_x``)."""
    if not isinstance(train, dict) or not train:
        raise ConfigError(f"config key {where!r}: must be a non-empty mapping of training settings "
                          f"like {{lr: 0.001}}; got {train!r}", where)
    if "budget_x" in train:
        raise ConfigError(f"config key '{where}.budget_x': set by the grid's 'budgets' key, not an "
                          "entry", f"{where}.budget_x")
    for task in tasks:
        try:
            task_settings(task, preset, {"train": train})
        except (ConfigError, ValueError, TypeError) as err:  # an unknown setting, or a value its type refuses
            raise ConfigError(f"config key '{where}': {err} (task {task!r})", where) from err


def _variant(index: int, item: Any, preset: str, tasks: list[str]) -> GridVariant:
    """One validated variant entry."""
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
    train = item.get("train", {})
    if "train" in item:
        _check_train(f"{where}.train", train, preset, only_tasks or tasks)
    return GridVariant(name=name, params=tuple(sorted(params.items())),
                       model=tuple(sorted(model.items())), train=tuple(sorted(train.items())),
                       role=role, title=title,
                       tasks=None if only_tasks is None else tuple(only_tasks))


def parse_grid(raw: dict[str, Any], only: Collection[str] | None = None) -> GridConfig:
    """Validate a training-grid mapping, its plug-ins imported already; ``only``: the ``--variant`` names to run."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"config key {unknown[0]!r}: unknown key; allowed keys are {sorted(_KEYS)}",
                          unknown[0])
    for key in ("name", "preset", "tasks", "variants"):
        if key not in raw:
            raise ConfigError(f"config key {key!r}: is required", key)
    plugins = plugin_modules(raw)  # checked, not imported
    if raw["preset"] not in list_task_presets():
        raise ConfigError(f"config key 'preset': unknown preset {raw['preset']!r}; presets are "
                          f"{list_task_presets()}", "preset")
    tasks = raw["tasks"]
    if not isinstance(tasks, list) or not tasks or any(t not in list_tasks() for t in tasks):
        raise ConfigError(f"config key 'tasks': must be a non-empty list of tasks from "
                          f"{list_tasks()}; got {tasks!r}", "tasks")
    unset = [t for t in tasks if t not in preset_tasks(raw["preset"])]
    if unset:
        raise ConfigError(f"config key 'tasks': task {unset[0]!r} has no settings in preset "
                          f"{raw['preset']!r}; the tasks it has settings for are "
                          f"{preset_tasks(raw['preset'])}", "tasks")
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
