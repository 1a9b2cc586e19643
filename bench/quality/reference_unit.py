"""A grid's reference rows as units: one (task, reference) computed in its own worker, its id depending on the
task, the preset and the data settings alone (docs/quality.md, "Grids")."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.engine.process import Worker, WorkerGone
from bench.quality.reference import get_reference, reference_names
from bench.quality.state import reference_state_columns
from bench.quality.tasks import get_task

if TYPE_CHECKING:
    import pandas as pd

#: what the ``attention_parts`` column says of a reference row
NO_ATTENTION = "none (reference without attention)"


def is_reference_row(row: Mapping[str, Any] | pd.Series) -> bool:
    """A row a :class:`ReferenceUnit` computed (not a trained entry with role ``reference``, such as the LSTM
    model, whose variant is an attention's name); :func:`reference_row_mask` over a DataFrame."""
    return row.get("role") == "reference" and row.get("variant") in reference_names()


def reference_row_mask(df: pd.DataFrame) -> pd.Series:
    """:func:`is_reference_row` for every row of ``df``, as a boolean mask."""
    return (df.role == "reference") & df.variant.isin(reference_names())


@dataclass(frozen=True)
class ReferenceUnit:
    """The reference ``reference`` on ``task`` with the preset's ``data`` settings."""

    task: str
    reference: str
    preset: str
    data: dict[str, Any]
    settings: str  # the task's resolved settings as recorded in every row (JSON)
    seed: int
    timeout_s: float
    device: str = "cpu"

    @property
    def unit_id(self) -> str:
        key = {"task": self.task, "reference": self.reference, "preset": self.preset,
               "data": self.data}
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return get_reference(self.reference).title

    def describe(self) -> str:
        return f"reference {self.task} {self.label} ({self.preset})"

    def _identity(self) -> dict[str, Any]:
        return {"unit_id": self.unit_id, "task": self.task, "variant": self.reference,
                "label": self.label, "seed": self.seed, "preset": self.preset,
                "role": "reference", "title": self.label, "overrides": "",
                "settings": self.settings, "attention_parts": NO_ATTENTION}

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        return [{**self._identity(), "params": "{}", "split": "-", "metric": "-",
                 "condition": "", "status": status, "reason": reason}]

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]:
        """Compute in a fresh worker; a death or a timeout becomes a failure row."""
        worker = Worker(reference_worker_main, (self.task, self.reference, self.data, self.seed))
        try:
            kind, payload = worker.receive(self.timeout_s)
        except TimeoutError:
            return self.failure_rows("timeout", f"timed out after {self.timeout_s:g} s")
        except WorkerGone as gone:
            return self.failure_rows(gone.status, gone.reason)
        finally:
            worker.kill()
        if kind == "failed":
            return self.failure_rows("error", payload)
        return [{**self._identity(), **row} for row in payload]


def reference_rows(task_name: str, reference: str, data: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Prepare the task and compute the reference: one ``test`` row per metric."""
    task = get_task(task_name, data, seed)
    start = time.perf_counter()
    task.prepare()
    outcome = get_reference(reference).compute(task)
    seconds = time.perf_counter() - start
    return [{"params": json.dumps(outcome.chosen, sort_keys=True), "split": "test",
             "metric": m.name, "condition": m.condition, "value": m.value, "status": "ok",
             "reason": "", "train_time_s": seconds, "seq_len": task.seq_len,
             "model_kind": task.model_kind, **reference_state_columns(task_name)}
            for m in outcome.metrics]


def reference_worker_main(task_name: str, reference: str, data: dict[str, Any], seed: int,
                          conn: Any) -> None:
    """Entry point of a reference worker: compute, then send the rows (or the error)."""
    try:
        rows = reference_rows(task_name, reference, data, seed)
    except Exception as err:  # one reference failing never loses another's rows
        conn.send(("failed", f"{type(err).__name__}: {err}"[:500]))
        return
    conn.send(("rows", rows))
