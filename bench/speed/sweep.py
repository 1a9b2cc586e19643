"""Running a speed sweep into a run directory (:func:`bench.engine.rundir.run_units` with the sweep's plan)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from bench.engine.executors import Executor, ExecutorSpec
from bench.engine.fsutil import atomic_write_json, read_json
from bench.engine.results import RESULTS_FILE
from bench.engine.row_schema import COLUMNS
from bench.engine.rundir import Chain, DryRunItem, MixedEnvironmentError, Rows, RunRecorder, counted, run_units
from bench.speed.cases import Case, expand_cases
from bench.speed.cases import chains as make_chains
from bench.speed.config import SweepConfig
from bench.speed.noise import noisy_in, slow_state_marker
from bench.speed.peak import PEAK_FLOPS, PEAK_KEY, PeakSpec
from bench.speed.rows import Row
from bench.speed.unit import record_failures, speed_chain

PEAK_FILE = "peak.json"
__all__ = ["MixedEnvironmentError", "SweepPlan", "peak_spec", "run_sweep"]


def peak_spec(run_dir: Path, config: SweepConfig) -> PeakSpec:
    """The units' :class:`PeakSpec`, with the finite peaks of ``peak.json`` (a resume measures none again)."""
    cache = read_peaks(run_dir)
    return PeakSpec(config.device, config.dtype, config.threads, config.peak_matmul_size,
                    tuple(sorted((k, float(v)) for k, v in cache.items()
                                 if isinstance(v, (int, float)) and math.isfinite(v))))


def read_peaks(run_dir: Path) -> dict[str, Any]:
    """``peak.json`` of ``run_dir`` (empty when there is none)."""
    path = Path(run_dir) / PEAK_FILE
    return read_json(path, what="matmul peak cache") if path.exists() else {}


def peak_recorder(run_dir: Path) -> Callable[[Row], None]:
    """A hook that pops the node's peak off each row and keeps it in ``peak.json`` when new and finite."""
    cache = read_peaks(run_dir)

    def record(row: Row) -> None:
        key, value = row.pop(PEAK_KEY, None), row.pop(PEAK_FLOPS, None)
        if key is None or value is None or not math.isfinite(value) or cache.get(key) == value:
            return
        cache[key] = value
        atomic_write_json(Path(run_dir) / PEAK_FILE, cache)
    return record


@dataclass(frozen=True)
class SweepPlan:
    """The :class:`RunPlan` of a speed sweep: its cases as chains of ``SpeedUnit``, into ``results.csv``."""

    config: SweepConfig
    cases: tuple[Case, ...]

    file: ClassVar[str] = RESULTS_FILE
    columns: ClassVar[list[str]] = COLUMNS
    config_file: ClassVar[str] = "sweep.json"

    @classmethod
    def of(cls, config: SweepConfig) -> SweepPlan:
        """The plan of ``config``: its cases, expanded once."""
        return cls(config, tuple(expand_cases(config)))

    @property
    def plugins(self) -> tuple[str, ...]:
        return self.config.plugins

    def size(self) -> str:
        return counted(len(self.cases), "case", "cases")

    def dry_run_items(self, kept: Rows, run_dir: Path) -> list[DryRunItem]:
        """Every case, ``done`` when each of its passes has a kept row."""
        done = {(r["case_id"], r["pass"]) for r in kept}
        return [DryRunItem(c.case_id, "done" if all((c.case_id, p) in done for p in c.passes)
                           else "todo", c.describe()) for c in self.cases]

    def outcome(self, rows: Rows) -> str:
        return ", ".join(f"{r['kernel_requested']} {r['pass']} {r['status']}" for r in rows)

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def threads(self) -> int | None:
        return self.config.threads

    @property
    def dtype(self) -> str:
        return self.config.dtype

    @property
    def row_settings(self) -> dict[str, Any]:
        """The noise policy: rows flagged under another threshold are not mixed in."""
        return {"noise_threshold": self.config.noise_threshold}

    def key(self, row: Row) -> tuple:
        return (row["case_id"], row["pass"])

    def resolved_config(self) -> dict[str, Any]:
        return asdict(self.config)

    def chains(self, recorder: RunRecorder) -> list[Chain]:
        """A chain per group with a (case, pass) still to run; earlier failures skip larger lengths."""
        done = {(r["case_id"], r["pass"]) for r in recorder.kept}
        if not any((c.case_id, p) not in done for c in self.cases for p in c.passes):
            return []
        failures: dict[tuple[Any, str], tuple[int, str]] = {}
        record_failures(failures, {c.case_id: c for c in self.cases}, recorder.kept)
        peak = peak_spec(recorder.run_dir, self.config)
        return [speed_chain(groups, done, failures, self.config.skip_larger_after_failure, peak)
                for groups in make_chains(list(self.cases), self.config.interleave)]

    def begin(self, run_dir: Path, env: dict[str, Any]) -> Callable[[Row], None]:
        """Each row's node peak goes to ``peak.json``, a slow state flags it (nothing measured: any driver can)."""
        record_peak, mark_slow = peak_recorder(run_dir), slow_state_marker(run_dir)

        def finish(row: Row) -> None:
            record_peak(row)
            mark_slow(row)
        return finish


def run_sweep(config: SweepConfig, run_dir: Path, *, executor: Executor | ExecutorSpec | None = None,
              allow_mixed: bool = False, retry_failed: bool = False, retry_noisy: bool = False,
              overwrite: bool = False, on_start: Callable[[Any], None] | None = None,
              on_done: Callable[[Any, Rows], None] | None = None) -> Rows:
    """Measure every unfinished (case, pass) of ``config`` into ``run_dir`` (:func:`run_units`); the new rows."""
    return run_units(run_dir, SweepPlan.of(config), executor=executor,
                     allow_mixed=allow_mixed, retry_failed=retry_failed, overwrite=overwrite,
                     redo=noisy_in(run_dir) if retry_noisy else None, on_start=on_start, on_done=on_done)
