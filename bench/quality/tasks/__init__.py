"""The quality tasks, one module each, and their registry: :func:`register_task`,
:func:`list_tasks`, :func:`task_info`, :func:`get_task`. Adding a task: docs/extending.md."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench.quality.tasks import (  # noqa: F401  (register the built-in tasks)
    bytelm,
    image,
    listops,
    mqar,
    pathfinder,
    recall,
    retrieval,
    selective_copy,
    text,
    translate,
    video,
)
from bench.quality.tasks.base import SPLITS, ClassificationTask, Metric, Split, Task
from bench.quality.tasks.registration import (
    TASKS,
    ConditionFigure,
    ConditionView,
    TaskInfo,
    display_unit,
    register_task,
    unregister_task,
)


def list_tasks() -> list[str]:
    """Registered task names in their order (the Long Range Arena's tasks first)."""
    return [info.name for info in sorted(TASKS.values(), key=lambda info: info.order)]


def task_info(name: str) -> TaskInfo:
    """The registry entry of task ``name``; ``ValueError`` lists the registered tasks."""
    if name not in TASKS:
        raise ValueError(f"TASK: unknown task {name!r}; tasks are {list_tasks()}")
    return TASKS[name]


def get_task(name: str, data: dict[str, Any], seed: int) -> Task:
    """The task ``name`` with its data settings; ``ValueError`` for an unknown task or data setting."""
    return task_info(name).cls(data, seed)


def order_tasks(names: Iterable[str]) -> list[str]:
    """``names`` in the registered tasks' order, then unknown ones sorted."""
    present = set(names)
    known = list_tasks()
    return [t for t in known if t in present] + sorted(present - set(known))


def headline_titles() -> dict[str, str]:
    """Every registered task's headline metric and how the report names it."""
    return {info.metric: info.metric_title for info in TASKS.values()}


def lower_is_better(metric: str) -> bool:
    """Whether a smaller ``metric`` is better (as the tasks whose headline it is say)."""
    return any(info.metric == metric and not info.higher_is_better for info in TASKS.values())


def condition_views() -> list[tuple[str, ConditionView]]:
    """Every task's metrics by condition, ``(task, view)`` in task order."""
    return [(name, view) for name in list_tasks() for view in TASKS[name].conditions]


__all__ = ["SPLITS", "ClassificationTask", "ConditionFigure", "ConditionView", "Metric", "Split",
           "Task", "TaskInfo", "condition_views", "display_unit", "get_task", "headline_titles",
           "list_tasks", "lower_is_better", "order_tasks", "register_task", "task_info",
           "unregister_task"]
