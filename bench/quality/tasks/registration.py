"""The table of quality tasks and :func:`register_task`, which fills it (docs/extending.md, "A task"); at the
bottom of the tasks package beside :mod:`bench.quality.tasks.base`, so imports run one way."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from attn.table import RegistrationError, Table, source_of
from bench.quality.tasks.base import Task

T = TypeVar("T", bound=type[Task])

#: the sections a task's settings in a preset may have
SECTIONS = ("data", "model", "attention", "train", "note")
#: where a task registered without an ``order`` goes: after the built-in tasks, in registration order
_LATER = itertools.count(1000)


@dataclass(frozen=True)
class ConditionFigure:
    """A figure of a metric by condition, a line per variant, the condition on a log-2 axis (``<stem>.png/.svg``)."""

    stem: str
    xlabel: str
    ylabel: str
    title: str
    #: a dotted line at the first condition, labelled as the training length
    training_length: bool = False
    #: each variant's reach by its mask dotted (bench/quality/reach.py, which reads the recall
    #: layout), rows without a mask dashed, and the floors (uniform chance, majority class)
    reach: bool = False


@dataclass(frozen=True)
class ConditionView:
    """A report table of test ``metric`` by condition ``prefix`` per variant, drawn with a ``figure``."""

    metric: str
    prefix: str
    title: str
    numeric: bool = True
    figure: ConditionFigure | None = None


@dataclass(frozen=True)
class TaskInfo:
    """A registered task: its class, its settings per preset and how it is shown."""

    name: str
    cls: type[Task]
    presets: Mapping[str, Mapping[str, Any]]
    order: float
    metric_title: str
    conditions: tuple[ConditionView, ...] = ()

    @property
    def metric(self) -> str:
        """The headline metric (test split, no condition)."""
        return self.cls.metric

    @property
    def higher_is_better(self) -> bool:
        return self.cls.higher_is_better

    def model_kind(self, data: Mapping[str, Any] | None = None) -> str:
        """The model kind the task trains with ``data`` (``pathfinder``'s ``input`` chooses it); no data loaded."""
        return self.cls(dict(data or {}), 0).model_kind

    def preset(self, name: str) -> dict[str, Any] | None:
        """A copy of the task's registered settings in task preset ``name`` (None: none)."""
        section = self.presets.get(name)
        return None if section is None else copy.deepcopy(dict(section))


TASKS: Table[TaskInfo] = Table("register_task")


def display_unit(metric: str) -> tuple[int, int]:
    """``(scale, decimals)`` a metric is shown in: accuracy in % to 0.1, others to 0.001."""
    return (100, 1) if metric == "accuracy" else (1, 3)


def register_task(name: str, *, presets: Mapping[str, Mapping[str, Any]],
                  order: float | None = None, metric_title: str | None = None,
                  conditions: tuple[ConditionView, ...] = (),
                  overwrite: bool = False) -> Callable[[T], T]:
    """Decorator registering a :class:`Task` subclass as task ``name`` (arguments: docs/extending.md)."""
    TASKS.check_name(name)
    checked = _presets(name, presets)

    def decorator(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise RegistrationError(f"register_task({name!r}): must decorate a Task subclass; got {cls!r}")
        existing = TASKS.get(name)
        place = order if order is not None else (existing.order if existing else next(_LATER))
        info = TaskInfo(name, cls, checked, float(place), metric_title or cls.metric, tuple(conditions))
        TASKS.add(name, info, source=source_of(cls), overwrite=overwrite)
        cls.name = name
        return cls

    return decorator


def unregister_task(name: str) -> None:
    """Remove task ``name`` (tests, plug-ins that replace a task); no error if absent."""
    TASKS.remove(name)


def _presets(name: str, presets: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``presets`` checked (a mapping of preset name to sections) and copied."""
    where = f"register_task({name!r}): presets"
    if not isinstance(presets, Mapping):
        raise RegistrationError(f"{where}: must be a mapping of task preset name to settings; got {presets!r}")
    out: dict[str, dict[str, Any]] = {}
    for preset, section in presets.items():
        if not isinstance(section, Mapping):
            raise RegistrationError(f"{where}[{preset!r}]: must be a mapping with sections from "
                                    f"{list(SECTIONS)}; got {section!r}")
        unknown = sorted(set(section) - set(SECTIONS))
        if unknown:
            raise RegistrationError(f"{where}[{preset!r}]: unknown section {unknown[0]!r}; sections are "
                                    f"{list(SECTIONS)}")
        out[str(preset)] = copy.deepcopy(dict(section))
    return out
