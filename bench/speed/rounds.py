"""Running one unit: the kernels of a variant at one length, in isolated workers, timed in
interleaved rounds (A, B, C, A, B, C, ...) so that their ratios share the machine's load.

For each pass, every case's worker first prepares (warm-up, a planning call, memory), one
worker at a time; then the rounds run, one timed call per case per round. All cases of the
unit get the same number of rounds: as many as the slowest case fits in its time budget,
never fewer than ``min_repeats``. A case that fails, times out or dies becomes a row with its
status and the others go on; its worker is restarted for its next pass. The timeout is per
case and pass, on the case's own calls.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.engine.measure import matmul_peak_flops, planned_repeats
from bench.engine.process import Worker, WorkerGone
from bench.speed.cases import Case
from bench.speed.worker import tflops, worker_main

PASS_ORDER = ("fwd", "bwd", "fwd_bwd", "train_step")
#: idle time between two cases' calls: lets the previous case's threads stop spinning
HANDOVER_S = 0.002


def base_row(case: Case, pass_name: str) -> dict[str, Any]:
    """The descriptive columns of a row (before measuring)."""
    return {
        "case_id": case.case_id, "label": case.label, "variant": case.variant,
        "kernel_requested": case.kernel, "kernel": case.kernel,
        "params": case.params_json, "seq_len": case.seq_len, "batch": case.batch,
        "heads": case.heads, "head_dim": case.head_dim, "dtype": case.dtype,
        "device": case.device, "causal": case.causal, "pass": pass_name,
    }


def failure_rows(case: Case, passes: tuple[str, ...] | list[str], status: str,
                 reason: str) -> list[dict[str, Any]]:
    """Rows for passes that produced no measurement."""
    return [{**base_row(case, p), "status": status, "reason": reason} for p in passes]


@dataclass(frozen=True)
class CaseRun:
    """A case and the passes a unit runs for it (the others are done or skipped)."""

    case: Case
    passes: tuple[str, ...]


@dataclass(frozen=True)
class SpeedUnit:
    """Cases at one length timed together in interleaved rounds (one kernel each), plus rows
    of passes recorded without running (skipped after a smaller length failed)."""

    runs: tuple[CaseRun, ...]
    skipped: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @property
    def unit_id(self) -> str:
        """Stable id of the unit (rows timed together share it)."""
        ids = sorted([r.case.case_id for r in self.runs]
                     + [f"{row['case_id']}/{row['pass']}" for row in self.skipped])
        return hashlib.sha1(",".join(ids).encode()).hexdigest()[:12]

    @property
    def device(self) -> str:
        """The device its cases run on."""
        return self.runs[0].case.device if self.runs else str(self.skipped[0]["device"])

    def describe(self) -> str:
        """One-line description for progress bars."""
        first = (self.runs[0].case if self.runs else None)
        if first is None:
            return f"{len(self.skipped)} skipped row(s)"
        kernels = "/".join(r.case.kernel for r in self.runs)
        causal = " causal" if first.causal else ""
        passes = "/".join(dict.fromkeys(p for r in self.runs for p in r.passes))
        return (f"{first.label} [{kernels}] N={first.seq_len} B={first.batch} H={first.heads} "
                f"D={first.head_dim} {first.dtype}{causal} {passes}")

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]:
        """Measure the runs (see :func:`run_unit`) and add the skipped rows."""
        return [*run_unit(self, cuda_visible), *self.skipped] if self.runs else list(self.skipped)

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        """A row per (case, pass) of the runs, all with this status (and the skipped rows)."""
        rows = [row for r in self.runs for row in failure_rows(r.case, r.passes, status, reason)]
        return [*rows, *self.skipped]


class _Member:
    """One case of a unit: its worker, its per-pass budget and what it measured."""

    def __init__(self, run: CaseRun, cuda_visible: str | None) -> None:
        self.case, self.passes, self.cuda_visible = run.case, run.passes, cuda_visible
        self.worker: Worker | None = None
        self.info: dict[str, Any] | None = None  # from "ready"
        self.rows: dict[str, dict[str, Any]] = {}
        self.spent = 0.0  # seconds of the current pass's own calls
        self.broken: _CaseFailed | None = None  # the attention could not be built

    def ensure_worker(self) -> None:
        """Start the worker if none is alive (first pass, or after a death)."""
        if self.worker is not None and self.worker.process.is_alive():
            return
        if self.broken is not None:
            raise self.broken
        self.worker = Worker(worker_main, (self.case.to_dict(), self.cuda_visible))
        try:
            message = self.worker.receive(self.case.timeout_s)
        except TimeoutError:
            self.stop()
            raise _CaseFailed("timeout", f"timed out after {self.case.timeout_s:g} s building "
                                         "the attention") from None
        except WorkerGone as gone:
            self.stop()
            raise _CaseFailed(gone.status, gone.reason) from None
        if message[0] != "ready":
            self.stop()
            self.broken = _CaseFailed(message[1], message[2])
            raise self.broken
        self.info = message[1]

    def ask(self, message: tuple[Any, ...], pass_name: str) -> tuple[Any, ...]:
        """Send a command and wait, counting the time against the pass's timeout."""
        assert self.worker is not None
        remaining = self.case.timeout_s - self.spent
        start = time.monotonic()
        try:
            reply = self.worker.request(message, max(remaining, 0.0))
        except TimeoutError:
            self.stop()
            raise _CaseFailed("timeout", f"timed out after {self.case.timeout_s:g} s in pass "
                                         f"{pass_name}") from None
        except WorkerGone as gone:
            self.stop()
            raise _CaseFailed(gone.status, gone.reason) from None
        finally:
            self.spent += time.monotonic() - start
        if reply[0] == "failed":
            raise _CaseFailed(reply[1], reply[2])
        return reply

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None


class _CaseFailed(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _timing_columns(times_s: list[float], flops: float) -> dict[str, Any]:
    times_ms = np.asarray(times_s) * 1e3
    median = float(np.median(times_ms))
    q25, q75 = np.percentile(times_ms, [25, 75])
    return {
        "time_ms": median, "time_iqr_ms": float(q75 - q25), "repeats": len(times_ms),
        "times_ms": json.dumps([float(f"{t:.6g}") for t in times_ms]),
        "tflops": tflops(flops, median),
    }


def _prepare(members: list[_Member], pass_name: str) -> list[tuple[_Member, dict[str, Any]]]:
    """Warm up and read memory for each member that runs this pass; failures become rows."""
    ready = []
    for member in members:
        member.spent = 0.0
        try:
            member.ensure_worker()
            ready.append((member, member.ask(("prepare", pass_name), pass_name)[1]))
        except _CaseFailed as failed:
            member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                  failed.reason)[0]
    return ready


def _run_pass(members: list[_Member], pass_name: str, unit_id: str) -> None:
    """Prepare, time in rounds and record one pass of every member that runs it."""
    ready = _prepare([m for m in members if pass_name in m.passes], pass_name)
    if not ready:
        return
    rounds = min(planned_repeats(info["estimate_ms"] / 1e3, budget_s=m.case.time_budget_s,
                                 minimum=m.case.min_repeats, maximum=m.case.repeats)
                 for m, info in ready)
    times: dict[int, list[float]] = {id(m): [] for m, _ in ready}
    alive = list(ready)
    for _ in range(rounds):
        for member, info in list(alive):
            try:
                times[id(member)].append(member.ask(("time", pass_name), pass_name)[1])
            except _CaseFailed as failed:
                member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                      failed.reason)[0]
                alive.remove((member, info))
            if len(ready) > 1:
                time.sleep(HANDOVER_S)
    for member, info in alive:
        try:
            finished = member.ask(("finish", pass_name), pass_name)[1]
        except _CaseFailed as failed:
            member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                  failed.reason)[0]
            continue
        assert member.info is not None
        member.rows[pass_name] = {
            **base_row(member.case, pass_name), "status": "ok", "reason": "",
            **{k: v for k, v in member.info.items() if k != "flops"},
            "flops": member.info["flops"][pass_name], **info, **finished,
            **_timing_columns(times[id(member)], member.info["flops"][pass_name]),
            "interleave_id": unit_id, "interleaved": len(ready),
        }


def run_unit(unit: SpeedUnit, cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Measure every (case, pass) of ``unit``; always one row per (case, pass) it names."""
    members = [_Member(run, cuda_visible) for run in unit.runs]
    try:
        for pass_name in PASS_ORDER:
            _run_pass(members, pass_name, unit.unit_id)
    finally:
        for member in members:
            if member.worker is not None:
                member.worker.close()
    rows = []
    for member in members:
        for pass_name in member.passes:
            rows.append(member.rows.get(pass_name) or failure_rows(
                member.case, [pass_name], "error", "no result (internal error)")[0])
    return rows


def run_case(case: Case, cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Measure one case alone (every pass); one row per pass."""
    return run_unit(SpeedUnit((CaseRun(case, case.passes),)), cuda_visible)


def _peak_main(device: str, dtype: str, threads: int | None, size: int | None, conn: Any) -> None:
    if threads:
        torch.set_num_threads(threads)
    conn.send(matmul_peak_flops(torch.device(device), getattr(torch, dtype), size))


def measure_peak(device: str, dtype: str, threads: int | None, size: int | None = None,
                 timeout_s: float = 300) -> float:
    """Matmul peak FLOP/s measured in a fresh worker on ``device`` (NaN if it fails)."""
    worker = Worker(_peak_main, (device, dtype, threads, size))
    try:
        return float(worker.receive(timeout_s))
    except (TimeoutError, WorkerGone):
        return math.nan
    finally:
        worker.kill()
