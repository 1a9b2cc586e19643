"""Running a speed sweep into a run directory: locked, resumable, isolated, one flushed record
per unit, every row carrying the environment that measured it (:func:`bench.engine.rundir.run_units`
with the sweep's plan).

Resume: rows already in ``results.csv`` are kept (whole rows only) and their (case, pass)
is not measured again; ``retry_failed`` measures failed, timed-out and skipped ones again.
Rows measured under another code version, device, dtype or thread count are never silently
mixed with new ones: the sweep refuses unless ``allow_mixed``, and the report then lists
which rows came from where.
"""

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
from bench.engine.rundir import Chain, MixedEnvironmentError, Planned, Rows, RunRecorder, run_units
from bench.speed.cases import Case, expand_cases
from bench.speed.cases import chains as make_chains
from bench.speed.config import SweepConfig
from bench.speed.rounds import measure_peak
from bench.speed.rows import Row, peak_fraction
from bench.speed.unit import FATAL, record_failure, speed_chain

PEAK_FILE = "peak.json"
__all__ = ["MixedEnvironmentError", "SweepPlan", "matmul_peak", "run_sweep"]


def matmul_peak(run_dir: Path, config: SweepConfig, dtype: str | None = None) -> float:
    """Matmul FLOP/s peak for this device/dtype/threads, measured once and cached in the run dir
    (``dtype``: another dtype than the sweep's, e.g. float32 for kernels that upcast)."""
    path = run_dir / PEAK_FILE
    size = config.peak_matmul_size or "default"
    dtype = dtype or config.dtype
    key = f"{config.device}/{dtype}/{config.threads or 'default'}/matmul{size}"
    cache = read_json(path, what="matmul peak cache") if path.exists() else {}
    if key not in cache or not math.isfinite(cache[key]):
        cache[key] = measure_peak(config.device, dtype, config.threads, config.peak_matmul_size)
        atomic_write_json(path, cache)
    return cache[key]


#: sweep dtypes whose cases may run on kernels that compute in float32 (their peak is measured too)
HALF_DTYPE_NAMES = ("float16", "bfloat16")


def row_peak(row: Row, peaks: dict[str, float]) -> float:
    """The matmul peak a row's FLOP/s is a fraction of: that of the dtype its kernel computes
    in (:func:`attn.registry.kernel_compute_dtype`; float32 for a kernel that upcasts half
    inputs), from ``peaks`` by dtype name; NaN when that peak was not measured."""
    import torch

    from attn.registry import kernel_compute_dtype

    dtype = str(row.get("dtype", ""))
    if dtype in HALF_DTYPE_NAMES and row.get("variant") and row.get("kernel"):
        computed = kernel_compute_dtype(str(row["variant"]), str(row["kernel"]), getattr(torch, dtype))
        dtype = str(computed).removeprefix("torch.")
    return peaks.get(dtype, math.nan)


@dataclass(frozen=True)
class SweepPlan:
    """The run plan (:class:`bench.engine.rundir.RunPlan`) of a speed sweep: its cases as
    chains of :class:`bench.speed.unit.SpeedUnit`, into ``results.csv``."""

    config: SweepConfig
    cases: tuple[Case, ...]

    file: ClassVar[str] = RESULTS_FILE
    columns: ClassVar[list[str]] = COLUMNS
    config_file: ClassVar[str] = "sweep.json"
    noun: ClassVar[str] = "cases"

    @classmethod
    def of(cls, config: SweepConfig) -> SweepPlan:
        """The plan of ``config``: its cases, expanded once."""
        return cls(config, tuple(expand_cases(config)))

    @property
    def plugins(self) -> tuple[str, ...]:
        return self.config.plugins

    def count(self) -> int:
        return len(self.cases)

    def preview(self, kept: Rows, run_dir: Path) -> list[Planned]:
        """Every case, ``done`` when each of its passes has a kept row."""
        done = {(r["case_id"], r["pass"]) for r in kept}
        return [Planned(c.case_id, "done" if all((c.case_id, p) in done for p in c.passes)
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

    def key(self, row: Row) -> tuple:
        return (row["case_id"], row["pass"])

    def settings(self) -> dict[str, Any]:
        return asdict(self.config)

    def chains(self, recorder: RunRecorder) -> list[Chain]:
        """A chain per group of cases with a (case, pass) not recorded yet; a curve whose pass
        already failed at a smaller length skips its larger ones (``skip_larger_after_failure``)."""
        done = {(r["case_id"], r["pass"]) for r in recorder.kept}
        if not any((c.case_id, p) not in done for c in self.cases for p in c.passes):
            return []
        failures: dict[tuple[Any, str], tuple[int, str]] = {}
        by_id = {c.case_id: c for c in self.cases}
        for row in recorder.kept:
            if row["case_id"] in by_id and row["status"] in FATAL:
                record_failure(failures, by_id[row["case_id"]], row["pass"], row["status"])
        return [speed_chain(groups, done, failures, self.config.skip_larger_after_failure)
                for groups in make_chains(list(self.cases), self.config.interleave)]

    def begin(self, run_dir: Path, env: dict[str, Any]) -> Callable[[Row], None]:
        """Measure (or read) the matmul peak of the sweep's dtype, and float32's for a half
        sweep (kernels that upcast compute there); each row then gets its share of the peak of
        the dtype its kernel computes in (:func:`row_peak`)."""
        peaks = {self.config.dtype: matmul_peak(run_dir, self.config)}
        if self.config.dtype in HALF_DTYPE_NAMES:
            peaks["float32"] = matmul_peak(run_dir, self.config, "float32")
        return lambda row: peak_fraction(row, row_peak(row, peaks), env["hostname"])


def run_sweep(
    config: SweepConfig,
    run_dir: Path,
    *,
    executor: Executor | ExecutorSpec | None = None,
    allow_mixed: bool = False,
    retry_failed: bool = False,
    overwrite: bool = False,
    on_start: Callable[[Any], None] | None = None,
    on_done: Callable[[Any, Rows], None] | None = None,
) -> Rows:
    """Measure every unfinished (case, pass) of ``config`` into ``run_dir``; returns new rows.

    Finished passes are skipped, so rerunning into the same directory resumes. With
    ``skip_larger_after_failure``, once a length of a curve times out or runs out of memory
    in a pass, the larger lengths of that curve and pass become ``skipped`` rows.
    """
    return run_units(run_dir, SweepPlan.of(config), executor=executor,
                     allow_mixed=allow_mixed, retry_failed=retry_failed, overwrite=overwrite,
                     on_start=on_start, on_done=on_done)
