"""Task presets (docs/quality.md, "Presets"): a task's settings are the preset file's defaults, then the task's
registered section, then the file's ``tasks`` section, then the caller's overrides, section by section; every
variant of a task gets the same ones."""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from attn import attention_info
from attn.validation import require_choice, require_int
from bench.engine.config import ConfigError, load_yaml
from bench.quality.tasks import list_tasks, task_info

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "tasks"
#: the model size (:data:`models.config.SIZES`) every task's model starts from
MODEL_SIZE = "mini"
SCHEDULES = ("cosine", "linear")


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation and evaluation schedule of one training run."""

    steps: int = 500
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    schedule: str = "cosine"  # decay after warm-up, to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100  # validation (and a best-checkpoint candidate) every this many steps
    eval_examples: int = 512  # validation examples (or byte windows) per evaluation
    checkpoint_every: int = 50  # resumable checkpoint every this many steps
    #: learning-rate multiplier of relative-position bias tables (docs/quality.md says how it was chosen)
    position_bias_lr_scale: float = 30.0
    #: matched compute (bench/quality/budget.py): train for budget_x times the FLOPs full attention spends in
    #: `steps` steps (None: `steps` steps)
    budget_x: float | None = None
    #: self-pretraining (bench/quality/pretrain.py): the first this many of `steps` denoise the task's inputs
    pretrain_steps: int = 0
    pretrain_mask_rate: float = 0.15  # share of real tokens replaced while pretraining

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_examples", "checkpoint_every"):
            _require_int(f"train.{name}", getattr(self, name), minimum=1)
        _require_int("train.warmup_steps", self.warmup_steps, minimum=0)
        for name in ("lr", "weight_decay", "grad_clip", "position_bias_lr_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"train.{name}: must be a number >= 0; got {value!r}", f"train.{name}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"train.min_lr_ratio: must be in [0, 1]; got {self.min_lr_ratio!r}",
                              "train.min_lr_ratio")
        require_choice("train.schedule", self.schedule, SCHEDULES,
                       error=functools.partial(ConfigError, key="train.schedule"))
        _require_int("train.pretrain_steps", self.pretrain_steps, minimum=0)
        if self.pretrain_steps >= self.steps:
            raise ConfigError(f"train.pretrain_steps: must be less than train.steps "
                              f"({self.steps}), which it is part of; got {self.pretrain_steps!r}",
                              "train.pretrain_steps")
        rate = self.pretrain_mask_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ConfigError(f"train.pretrain_mask_rate: must be a number in (0, 1]; got "
                              f"{rate!r}", "train.pretrain_mask_rate")
        if self.budget_x is not None:
            value = self.budget_x
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"train.budget_x: must be a number > 0 (a multiple of full "
                                  f"attention's FLOPs at train.steps) or null; got {value!r}",
                                  "train.budget_x")
            object.__setattr__(self, "budget_x", float(value))  # 1 and 1.0: one setting, one JSON


@dataclass(frozen=True)
class TaskSettings:
    """Everything one (task, preset) fixes; identical for every variant of the task."""

    task: str
    preset: str
    data: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    attention: dict[str, Any] = field(default_factory=dict)
    train: TrainSettings = field(default_factory=TrainSettings)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON files and rows)."""
        return asdict(self)

    def to_json(self) -> str:
        """The settings as one canonical JSON string (a result row's ``settings`` column)."""
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


def settings_that_apply(settings_json: str, variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """A row's recorded settings less what cannot change the run of ``variant(params)``, so that a new train
    setting does not make every recorded unit look stale: ``budget_x`` unset (or absent), the pretraining
    settings without pretraining steps, ``position_bias_lr_scale`` for a variant without relative-bias tables."""
    settings = json.loads(settings_json)
    train = settings.get("train", {})
    if train.get("budget_x") is None:
        train.pop("budget_x", None)
    if not train.get("pretrain_steps"):
        train.pop("pretrain_steps", None)
        train.pop("pretrain_mask_rate", None)
    if variant != "relative" and not params.get("position_bias"):
        train.pop("position_bias_lr_scale", None)
    return settings


def list_task_presets() -> list[str]:
    """Names of the task presets shipped in ``bench/configs/tasks`` (``tiny``, ``small``, ``lra``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _load_preset(preset: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise ConfigError(f"--preset: unknown preset {preset!r}; presets are {list_task_presets()}",
                          "preset")
    raw = load_yaml(path)
    if not isinstance(raw, dict) or "defaults" not in raw:
        raise ConfigError(f"{path}: a task preset needs a 'defaults' section (and may override "
                          "tasks in a 'tasks' section)", "defaults")
    return raw


def preset_tasks(preset: str) -> list[str]:
    """The registered tasks that have settings in ``preset`` (their own, or the preset file's), in task order."""
    written = _load_preset(preset).get("tasks") or {}
    return [t for t in list_tasks() if task_info(t).preset(preset) is not None or t in written]


def _merged(base: dict[str, Any], override: dict[str, Any] | None, where: str) -> dict[str, Any]:
    if override is not None and not isinstance(override, dict):
        raise ConfigError(f"{where}: must be a mapping; got {override!r}", where)
    return {**base, **(override or {})}


def task_settings(task: str, preset: str, overrides: dict[str, Any] | None = None) -> TaskSettings:
    """The settings of ``task`` in ``preset``, with ``overrides`` of the same shape (``{"train": {"steps": 10}}``)."""
    raw = _load_preset(preset)
    written = raw.get("tasks") or {}
    registered = task_info(task).preset(preset) if task in list_tasks() else None
    if task not in list_tasks() or (registered is None and task not in written):
        raise ConfigError(f"TASK: unknown task {task!r} in preset {preset!r}; tasks are "
                          f"{sorted(preset_tasks(preset))}", "task")
    defaults, overrides = raw.get("defaults", {}), overrides or {}
    sections = (registered or {}, written.get(task) or {})
    unknown = sorted(set(overrides) - {"data", "model", "attention", "train"})
    if unknown:
        raise ConfigError(f"overrides: unknown section {unknown[0]!r}; sections are "
                          "['attention', 'data', 'model', 'train']", unknown[0])
    merged = {}
    for part in ("data", "model", "attention", "train"):
        value = defaults.get(part, {})
        for section in sections:
            value = _merged(value, section.get(part), f"tasks.{task}.{part}")
        merged[part] = _merged(value, overrides.get(part), f"overrides.{part}")
    try:
        task_info(task).cls.Data.of(task, merged["data"])  # an unknown key or a wrong type, named now
    except ValueError as error:
        raise ConfigError(str(error), "data") from None
    train_keys = {f.name for f in fields(TrainSettings)}
    unknown = sorted(set(merged["train"]) - train_keys)
    if unknown:
        raise ConfigError(f"train.{unknown[0]}: unknown setting; settings are {sorted(train_keys)}",
                          f"train.{unknown[0]}")
    return TaskSettings(task=task, preset=preset, data=copy.deepcopy(merged["data"]),
                        model=copy.deepcopy(merged["model"]),
                        attention=copy.deepcopy(merged["attention"]),
                        train=TrainSettings(**merged["train"]),
                        note=str(sections[1].get("note", sections[0].get("note", ""))))


def attention_params(variant: str, params: dict[str, Any], settings: TaskSettings) -> dict[str, Any]:
    """The task's attention settings for every parameter the variant has, then the given ``params``."""
    allowed = attention_info(variant).params
    shared = {k: v for k, v in settings.attention.items() if k in allowed}
    return {**shared, **params}


def _require_int(key: str, value: Any, *, minimum: int) -> int:
    """:func:`attn.validation.require_int` raising the ``ConfigError`` that names ``key``."""
    return require_int(key, value, minimum=minimum, error=functools.partial(ConfigError, key=key))
