"""The run plan of a pretrained-model run (:class:`bench.engine.rundir.RunPlan`): its units
into ``pretrained.csv``, each a chain of its own, resumable unit by unit."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from bench.engine.fsutil import atomic_write_text
from bench.engine.row_schema import PRETRAINED_COLUMNS
from bench.engine.rundir import Chain, DryRunItem, RunPlan, RunRecorder, counted, run_units
from bench.pretrained.config import PretrainedConfig
from bench.pretrained.units import PretrainedUnit, units

RESULTS_FILE = "pretrained.csv"


@dataclass(frozen=True)
class PretrainedPlan:
    """The units of ``config``, each recorded whole when it finishes."""

    config: PretrainedConfig

    file: ClassVar[str] = RESULTS_FILE
    columns: ClassVar[list[str]] = PRETRAINED_COLUMNS
    config_file: ClassVar[str] = "pretrained.json"
    dtype: ClassVar[str] = "float32"

    @property
    def plugins(self) -> tuple[str, ...]:
        return self.config.plugins

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def threads(self) -> int | None:
        return self.config.threads

    @property
    def row_settings(self) -> dict[str, Any]:
        return {}

    def size(self) -> str:
        return counted(len(units(self.config)), "unit", "units")

    def dry_run_items(self, kept: list[dict[str, Any]], run_dir: Path) -> list[DryRunItem]:
        done = {r["cell_id"] for r in kept}
        return [DryRunItem(u.unit_id, "done" if u.unit_id in done else "todo", u.describe())
                for u in units(self.config)]

    def outcome(self, rows: list[dict[str, Any]]) -> str:
        ok = [r for r in rows if r.get("status") == "ok" and r.get("value") is not None]
        if not ok:
            return f"{rows[0]['status']}: {rows[0].get('reason', '')}"
        return ", ".join(f"{r['metric']} {r['value']:.4g}" for r in ok[:4]) + (" ..." if len(ok) > 4 else "")

    def key(self, row: dict[str, Any]) -> tuple:
        return tuple(str(row.get(c) or "") for c in ("cell_id", "label", "document", "seq_len",
                                                     "depth", "positions", "metric"))

    def resolved_config(self) -> dict[str, Any]:
        return dict(self.config.raw)

    def chains(self, recorder: RunRecorder) -> list[Chain]:
        done = {r["cell_id"] for r in recorder.kept}
        return [_single(u) for u in units(self.config) if u.unit_id not in done]

    def begin(self, run_dir: Path, env: dict[str, Any]) -> Callable[[dict[str, Any]], None] | None:
        """Write the config itself beside the results (``pretrained.yaml``)."""
        atomic_write_text(run_dir / "pretrained.yaml", yaml.safe_dump(self.config.raw, sort_keys=False))
        return None


def _single(unit: PretrainedUnit) -> Generator[PretrainedUnit, Any, None]:
    yield unit


def run_pretrained(config: PretrainedConfig, out: Path, **options: Any) -> list[dict[str, Any]]:
    """Run every unit of ``config`` not done yet into ``out``; the new rows."""
    plan: RunPlan = PretrainedPlan(config)
    return run_units(out, plan, **options)
