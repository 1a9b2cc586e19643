"""A training grid's run plan (:class:`GridPlan`) for :func:`bench.engine.rundir.run_units`: rows into
``quality.csv``, stale and foreign ones into ``superseded.csv`` (docs/quality.md, "Grids")."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from bench.engine.config import ConfigError
from bench.engine.executors import Executor, ExecutorSpec
from bench.engine.fsutil import atomic_write_text
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.engine.rundir import Chain, DryRunItem, RunRecorder, counted, run_units
from bench.quality.budget import strip_budget
from bench.quality.grid_config import GridConfig, canonical
from bench.quality.reference_unit import ReferenceUnit, is_reference_row
from bench.quality.settings import attention_params, settings_that_apply, task_settings
from bench.quality.units import SettingsCache, TrainUnit, trains, units

QUALITY_FILE = "quality.csv"
SUPERSEDED_FILE = "superseded.csv"  # rows of units whose task settings have since changed


def _row_json(row: dict[str, Any], column: str) -> Any:
    """A JSON column of a row (empty: ``{}``); ``ValueError`` when it does not parse."""
    text = row.get(column) or "{}"
    return json.loads(text)


def superseded_units(rows: list[dict[str, Any]], config: GridConfig) -> set[str]:
    """Units whose rows were trained with other task settings than the preset gives now: they run again."""
    now = SettingsCache(config.preset)
    stale = set()
    for row in rows:
        if not row.get("settings") or row.get("task") not in config.tasks:
            continue
        if is_reference_row(row):  # a reference reads the data settings only
            recorded = json.loads(row["settings"]).get("data")
            if canonical(recorded) != canonical(now(row["task"], {}).data):
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
    """Units of the grid's tasks whose (variant, parameters, overrides) no entry gives any more."""
    wanted: dict[str, set[tuple[str, str, str]]] = {}
    settings_of = SettingsCache(config.preset)
    for task in config.tasks:
        wanted[task] = set()
        for variant in config.variants:
            if not trains(config, task, variant):
                continue
            settings = settings_of(task, variant.overrides)
            overrides = canonical(variant.overrides)
            for params in (dict(variant.params),  # failure rows of earlier versions
                           attention_params(variant.name, dict(variant.params), settings)):
                wanted[task].add((variant.name, canonical(params), overrides))
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
            key = (row["variant"], canonical(_row_json(row, "params")),
                   canonical(strip_budget(_row_json(row, "overrides"), budgets)))
        except ValueError:
            continue  # unreadable: not ours to judge
        if key not in wanted[row["task"]]:
            foreign.add(row["unit_id"])
    return foreign


def resolved_settings(config: GridConfig) -> dict[str, Any]:
    """Every task's settings in this grid's preset (written beside the results)."""
    return {"grid": dict(config.raw),
            "tasks": {t: task_settings(t, config.preset).to_dict()
                      for t in config.raw.get("tasks", config.tasks)}}  # all, also for --task


@dataclass(frozen=True)
class GridPlan:
    """The run plan (:class:`bench.engine.rundir.RunPlan`) of a training grid, one chain per unit."""

    config: GridConfig

    file: ClassVar[str] = QUALITY_FILE
    columns: ClassVar[list[str]] = QUALITY_COLUMNS
    config_file: ClassVar[str] = "grid.json"
    dtype: ClassVar[str] = "float32"

    @property
    def plugins(self) -> tuple[str, ...]:
        return self.config.plugins

    def size(self) -> str:
        """E.g. ``24 training runs and 9 computed references``."""
        found = units(self.config, Path("."))  # (where the units would write is no matter)
        references = sum(isinstance(u, ReferenceUnit) for u in found)
        said = counted(len(found) - references, "training run", "training runs")
        if references:
            said += f" and {counted(references, 'computed reference', 'computed references')}"
        return said

    def dry_run_items(self, kept: list[dict[str, Any]], run_dir: Path) -> list[DryRunItem]:
        """Every unit: ``done``, ``todo (settings changed)`` or ``todo``."""
        stale = superseded_units(kept, self.config)
        done = {r["unit_id"] for r in kept} - stale
        return [DryRunItem(u.unit_id, "done" if u.unit_id in done else
                           "todo (settings changed)" if u.unit_id in stale else "todo",
                           u.describe())
                for u in units(self.config, run_dir)]

    def outcome(self, rows: list[dict[str, Any]]) -> str:
        """The unit's test headline numbers, or its status."""
        found = [r for r in rows if r.get("split") == "test" and not r.get("condition")]
        return ", ".join(f"{r['metric']} {r['value']:.4g}" for r in found) or rows[0]["status"]

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def threads(self) -> int | None:
        return self.config.threads

    @property
    def row_settings(self) -> dict[str, Any]:
        """None: a training row's settings are in its unit id (superseded when changed)."""
        return {}

    def key(self, row: dict[str, Any]) -> tuple:
        return (row["unit_id"], row["split"], row["metric"], row["condition"])

    def resolved_config(self) -> dict[str, Any]:
        return resolved_settings(self.config)

    def chains(self, recorder: RunRecorder) -> list[Chain]:
        """The units not recorded yet, after moving stale and foreign rows to ``superseded.csv``."""
        stale = (superseded_units(recorder.kept, self.config)
                 | foreign_units(recorder.kept, self.config))
        recorder.supersede(lambda row: row["unit_id"] in stale, SUPERSEDED_FILE)
        done = {r["unit_id"] for r in recorder.kept}
        return [_single(u) for u in units(self.config, recorder.run_dir) if u.unit_id not in done]

    def begin(self, run_dir: Path, env: dict[str, Any]) -> None:
        """Write the config itself beside the results (``grid.yaml``)."""
        atomic_write_text(run_dir / "grid.yaml", yaml.safe_dump(self.config.raw, sort_keys=False))


def run_grid(config: GridConfig, out: Path, *, executor: Executor | ExecutorSpec | None = None,
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
