"""The quality tasks, one module each; :func:`get_task` builds one by name.

To add a task: copy the smallest module that is like it (``text.py`` for a classification
of sequences, ``bytelm.py`` for a language model), give it a ``name``, list it in
:func:`task_classes`, and add its settings to every preset in ``bench/configs/tasks/``.
"""

from __future__ import annotations

from typing import Any

from bench.quality.tasks.base import SPLITS, ClassificationTask, Metric, Split, Task
from bench.quality.tasks.bytelm import ByteLM
from bench.quality.tasks.image import ImagePatches, ImagePixels
from bench.quality.tasks.listops import ListOps
from bench.quality.tasks.mqar import MQAR
from bench.quality.tasks.pathfinder import Pathfinder
from bench.quality.tasks.recall import Recall
from bench.quality.tasks.retrieval import Retrieval
from bench.quality.tasks.text import Text
from bench.quality.tasks.translate import Translate


def task_classes() -> dict[str, type[Task]]:
    """Every task class by name, in LRA order (their data packages load only when a task prepares)."""
    classes = (ListOps, Text, Retrieval, ImagePixels, ImagePatches, Pathfinder, ByteLM,
               Translate, Recall, MQAR)
    return {cls.name: cls for cls in classes}


def list_tasks() -> list[str]:
    """Task names in LRA order (the quality table's columns)."""
    return list(task_classes())


def get_task(name: str, data: dict[str, Any], seed: int) -> Task:
    """The task ``name`` with its data settings; ``ValueError`` lists the known tasks."""
    classes = task_classes()
    if name not in classes:
        raise ValueError(f"TASK: unknown task {name!r}; tasks are {list(classes)}")
    return classes[name](data, seed)


__all__ = ["SPLITS", "ClassificationTask", "Metric", "Split", "Task", "get_task", "list_tasks",
           "task_classes"]
