"""Running a sweep into a run directory: resumable, isolated, one flushed record per case."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.cases import Case, expand_cases
from bench.config import SweepConfig
from bench.results import ResultsWriter, environment, read_rows, write_env
from bench.worker import failure_rows, measure_peak, run_case

PEAK_FILE = "peak.json"
_FATAL = ("timeout", "oom")


def complete_rows(rows: list[dict[str, str]], cases: list[Case]) -> list[dict[str, str]]:
    """Rows of cases that finished every pass, each (case, pass) once (first record wins)."""
    by_case: dict[str, dict[str, dict[str, str]]] = {}
    for row in rows:
        by_case.setdefault(row["case_id"], {}).setdefault(row["pass"], row)
    expected = {c.case_id: c.passes for c in cases}
    keep = []
    for case_id, passes in by_case.items():
        need = expected.get(case_id, tuple(passes))  # rows of other configs are kept as they are
        if all(p in passes for p in need):
            keep.extend(passes[p] for p in need)
    return keep


def matmul_peak(run_dir: Path, config: SweepConfig) -> float:
    """Matmul FLOP/s peak for this device/dtype/threads, measured once and cached in the run dir."""
    path = run_dir / PEAK_FILE
    size = config.peak_matmul_size or "default"
    key = f"{config.device}/{config.dtype}/{config.threads or 'default'}/matmul{size}"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if key not in cache or not math.isfinite(cache[key]):
        cache[key] = measure_peak(config.device, config.dtype, config.threads,
                                  config.peak_matmul_size)
        path.write_text(json.dumps(cache, indent=2) + "\n")
    return cache[key]


def _skip_reason(case: Case, failures: dict[tuple, tuple[int, str]]) -> str | None:
    failed = failures.get(case.group)
    if failed and failed[0] < case.seq_len:
        return f"skipped: N={failed[0]} already hit {failed[1]}"
    return None


def run_sweep(
    config: SweepConfig,
    run_dir: Path,
    *,
    on_start: Callable[[Case, int, int], None] | None = None,
    on_done: Callable[[Case, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every unfinished case of ``config`` into ``run_dir``; returns the new rows.

    Finished cases (all passes recorded) are skipped, so rerunning into the same directory
    resumes. With ``skip_larger_after_failure``, once a length times out or runs out of
    memory, the larger lengths of that curve become ``skipped`` rows with the reason.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    cases = expand_cases(config)
    existing = read_rows(run_dir)
    kept = complete_rows(existing, cases)
    writer = ResultsWriter(run_dir, kept if len(kept) != len(existing) or existing else None)
    done = {r["case_id"] for r in kept}
    env = environment(config.device, config.threads)
    write_env(run_dir, env)
    (run_dir / "sweep.json").write_text(json.dumps(asdict(config), indent=2, default=str) + "\n")
    by_id = {c.case_id: c for c in cases}
    failures: dict[tuple, tuple[int, str]] = {}
    for row in kept:
        case = by_id.get(row["case_id"])
        if case is not None and row["status"] in _FATAL:
            prev = failures.get(case.group)
            if prev is None or case.seq_len < prev[0]:
                failures[case.group] = (case.seq_len, row["status"])
    todo = [c for c in cases if c.case_id not in done]
    peak = matmul_peak(run_dir, config) if todo else math.nan
    env_cols = {k: env[k] for k in ("device_name", "torch_version", "xformers_version",
                                    "git_sha", "timestamp")}
    new_rows: list[dict[str, Any]] = []
    for index, case in enumerate(todo):
        if on_start is not None:
            on_start(case, index, len(todo))
        reason = _skip_reason(case, failures) if config.skip_larger_after_failure else None
        rows = failure_rows(case, list(case.passes), "skipped", reason) if reason else run_case(case)
        for row in rows:
            row.update(env_cols)
            row.setdefault("threads", env["threads"])
            tflops = row.get("tflops")
            if row["status"] == "ok" and tflops is not None and math.isfinite(peak):
                row["peak_fraction"] = tflops * 1e12 / peak
            if row["status"] in _FATAL and case.group not in failures:
                failures[case.group] = (case.seq_len, row["status"])
        writer.append(rows)
        new_rows.extend(rows)
        if on_done is not None:
            on_done(case, rows)
    return new_rows
