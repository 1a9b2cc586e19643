"""Running a speed sweep into a run directory: locked, resumable, isolated, one flushed record
per unit, every row carrying the environment that measured it.

Resume: rows already in ``results.csv`` are kept (whole rows only) and their (case, pass)
is not measured again; ``retry_failed`` measures failed, timed-out and skipped ones again.
Rows measured under another code version, device, dtype or thread count are never silently
mixed with new ones: the sweep refuses unless ``allow_mixed``, and the report then lists
which rows came from where.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.engine.config import ConfigError, SweepConfig
from bench.engine.executors import Executor, LocalExecutor
from bench.engine.fsutil import RunLock, atomic_write_json, read_json
from bench.engine.provenance import environment
from bench.engine.results import COLUMNS, RESULTS_FILE
from bench.engine.rundir import MixedEnvironmentError, RunRecorder
from bench.speed.cases import chains as make_chains
from bench.speed.cases import expand_cases
from bench.speed.rounds import measure_peak
from bench.speed.schedule import FATAL, drive, record_failure, speed_chain

PEAK_FILE = "peak.json"
__all__ = ["MixedEnvironmentError", "check_device", "matmul_peak", "run_sweep"]


def check_device(device: str) -> None:
    """``ConfigError`` before any case runs when the config's device is not available here."""
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("config key 'device': cuda is not available on this machine "
                              "(torch.cuda.is_available() is False); allowed here: ['cpu']",
                              "device")


def matmul_peak(run_dir: Path, config: SweepConfig) -> float:
    """Matmul FLOP/s peak for this device/dtype/threads, measured once and cached in the run dir."""
    path = run_dir / PEAK_FILE
    size = config.peak_matmul_size or "default"
    key = f"{config.device}/{config.dtype}/{config.threads or 'default'}/matmul{size}"
    cache = read_json(path, what="matmul peak cache") if path.exists() else {}
    if key not in cache or not math.isfinite(cache[key]):
        cache[key] = measure_peak(config.device, config.dtype, config.threads,
                                  config.peak_matmul_size)
        atomic_write_json(path, cache)
    return cache[key]


def _peak_fraction(row: dict[str, Any], peak: float, host: str) -> None:
    """The row's FLOP/s over the same-run matmul peak, measured on the driver's machine: rows
    from other machines (cluster nodes) have none."""
    tflops = row.get("tflops")
    if (row["status"] == "ok" and tflops is not None and math.isfinite(peak)
            and row.get("hostname", host) == host):
        row["peak_fraction"] = tflops * 1e12 / peak


def run_sweep(
    config: SweepConfig,
    run_dir: Path,
    *,
    executor: Executor | None = None,
    allow_mixed: bool = False,
    retry_failed: bool = False,
    overwrite: bool = False,
    on_start: Callable[[Any], None] | None = None,
    on_done: Callable[[Any, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every unfinished (case, pass) of ``config`` into ``run_dir``; returns new rows.

    Finished passes are skipped, so rerunning into the same directory resumes. With
    ``skip_larger_after_failure``, once a length of a curve times out or runs out of memory
    in a pass, the larger lengths of that curve and pass become ``skipped`` rows.
    """
    check_device(config.device)
    cases = expand_cases(config)
    if not cases:
        raise ConfigError("the sweep has no cases: no variant has any of the requested kernels "
                          f"{list(config.kernels)}", "kernels")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir):
        recorder = RunRecorder(run_dir, file=RESULTS_FILE, columns=COLUMNS,
                               key=lambda r: (r["case_id"], r["pass"]), overwrite=overwrite,
                               retry_failed=retry_failed)
        done = {(r["case_id"], r["pass"]) for r in recorder.kept}
        todo = [c for c in cases if any((c.case_id, p) not in done for p in c.passes)]
        env = environment(config.device, config.threads)
        executor = executor or LocalExecutor(config.device)
        recorder.start(env, dtype=config.dtype, allow_mixed=allow_mixed, has_work=bool(todo),
                       config={k: v for k, v in asdict(config).items() if k != "raw"},
                       config_file="sweep.json", local=isinstance(executor, LocalExecutor))
        if not todo:
            executor.shutdown()
            return []
        failures: dict[tuple[Any, str], tuple[int, str]] = {}
        by_id = {c.case_id: c for c in cases}
        for row in recorder.kept:
            if row["case_id"] in by_id and row["status"] in FATAL:
                record_failure(failures, by_id[row["case_id"]], row["pass"], row["status"])
        peak = matmul_peak(run_dir, config)
        new_rows: list[dict[str, Any]] = []

        def done_unit(unit: Any, rows: list[dict[str, Any]]) -> None:
            for row in rows:
                _peak_fraction(row, peak, env["hostname"])
            recorder.record(rows)
            new_rows.extend(rows)
            if on_done is not None:
                on_done(unit, rows)

        chains = [speed_chain(groups, done, failures, config.skip_larger_after_failure)
                  for groups in make_chains(cases, config.interleave)]
        try:
            drive(chains, executor, on_start=on_start, on_done=done_unit)
        finally:
            executor.shutdown()
        return new_rows
