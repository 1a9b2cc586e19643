"""Timing a speed unit's cases in workers, in interleaved rounds (docs/measurement.md); the matmul peak's worker."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from attn.kernels import get_kernel, kernel_names
from bench.engine.measure import matmul_peak_flops, repeats_in_budget
from bench.engine.process import Worker, WorkerGone
from bench.engine.row_schema import SPEED_PASSES
from bench.speed.cases import Case
from bench.speed.rows import failure_rows, measured_row
from bench.speed.worker import worker_main

#: idle time between two cases' calls: lets the previous case's threads stop spinning
HANDOVER_S = 0.002
#: how long a worker may take to release its memory before it is stopped instead
RELEASE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CaseRun:
    """A case and the passes a unit runs for it (the others are done or skipped)."""

    case: Case
    passes: tuple[str, ...]


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

    def _request(self, message: tuple[Any, ...], limit: float, timeout: tuple[str, str]) -> tuple[Any, ...]:
        """The reply to ``message`` within ``limit`` s; else a :class:`_CaseFailed` (``timeout`` its reason)."""
        assert self.worker is not None
        try:
            reply = self.worker.request(message, limit)
        except TimeoutError:
            self.stop()
            raise _CaseFailed(*timeout) from None
        except WorkerGone as gone:
            self.stop()
            raise _CaseFailed(gone.status, gone.reason) from None
        if reply[0] == "failed":
            raise _CaseFailed(reply[1], reply[2])
        return reply

    def warm(self, pass_name: str) -> dict[str, Any]:
        """The first call and warm-up within ``timeout_s`` (plus ``compile_timeout_s`` where it may compile)."""
        compiles = may_compile(self.case)
        limit = self.case.timeout_s + (self.case.compile_timeout_s if compiles else 0.0)
        timeout = (("compile_timeout", f"timed out after {limit:g} s in the first call (compiles, caches) of pass "
                    f"{pass_name}") if compiles else ("timeout", f"timed out after {limit:g} s in pass {pass_name}"))
        return self._request(("warm", pass_name), limit, timeout)[1]

    def ask(self, message: tuple[Any, ...], pass_name: str) -> tuple[Any, ...]:
        """Send a command and wait, counting the time against the pass's timeout."""
        start = time.monotonic()
        try:
            return self._request(message, max(self.case.timeout_s - self.spent, 0.0),
                                 ("timeout", f"timed out after {self.case.timeout_s:g} s in pass {pass_name}"))
        finally:
            self.spent += time.monotonic() - start

    def release(self) -> None:
        """Have a running worker drop its inputs, module and cached device memory; stop it if it does not answer."""
        if self.worker is None or not self.worker.process.is_alive():
            return
        try:
            self.worker.request(("release",), RELEASE_TIMEOUT_S)
        except (TimeoutError, WorkerGone):
            self.stop()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None


def may_compile(case: Case) -> bool:
    """Whether the case's kernel compiles per call shape (``flex``, or ``auto`` on CUDA)."""
    if case.kernel == "auto":
        return case.device == "cuda"
    return case.kernel in kernel_names() and get_kernel(case.kernel).compiles_per_shape


class _CaseFailed(WorkerGone):
    """A case's pass failed; ``status`` and ``reason`` say how."""


def _prepare(members: list[_Member], pass_name: str) -> list[tuple[_Member, dict[str, Any]]]:
    """Warm up and read memory for each member that runs this pass; failures become rows."""
    ready = []
    for member in members:
        member.spent = 0.0
        try:
            member.ensure_worker()
            ready.append((member, {**member.warm(pass_name), **member.ask(("prepare", pass_name), pass_name)[1]}))
        except _CaseFailed as failed:
            member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                  failed.reason)[0]
    return ready


def _ask_each(alive: list[tuple[_Member, dict[str, Any]]], message: tuple[Any, ...],
              pass_name: str, into: dict[int, list[float]], pause_s: float = 0.0) -> None:
    """Send ``message`` to each alive member, appending replies to ``into``; failures leave ``alive``."""
    for member, info in list(alive):
        try:
            into[id(member)].append(member.ask(message, pass_name)[1])
        except _CaseFailed as failed:
            member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                  failed.reason)[0]
            alive.remove((member, info))
        if pause_s:
            time.sleep(pause_s)


def _run_pass(members: list[_Member], pass_name: str, unit_id: str) -> None:
    """Prepare, time in rounds between two probes and record one pass of every member that runs it."""
    ready = _prepare([m for m in members if pass_name in m.passes], pass_name)
    if not ready:
        return
    rounds = min(repeats_in_budget(info["estimate_ms"] / 1e3, budget_s=m.case.time_budget_s,
                                   minimum=m.case.min_repeats, maximum=m.case.repeats)
                 for m, info in ready)
    times: dict[int, list[float]] = {id(m): [] for m, _ in ready}
    probes: dict[int, list[float]] = {id(m): [] for m, _ in ready}
    alive = list(ready)
    _ask_each(alive, ("probe",), pass_name, probes)
    handover = HANDOVER_S if len(ready) > 1 else 0.0
    for _ in range(rounds):
        _ask_each(alive, ("time", pass_name), pass_name, times, handover)
    _ask_each(alive, ("probe",), pass_name, probes)
    for member, info in alive:
        try:
            finished = member.ask(("finish", pass_name), pass_name)[1]
        except _CaseFailed as failed:
            member.rows[pass_name] = failure_rows(member.case, [pass_name], failed.status,
                                                  failed.reason)[0]
            continue
        assert member.info is not None
        member.rows[pass_name] = measured_row(member.case, pass_name, member.info, info, finished,
                                              times[id(member)], unit_id, len(ready),
                                              tuple(probes[id(member)]))


def run_rounds(runs: tuple[CaseRun, ...], unit_id: str,
               cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Measure every (case, pass) of ``runs``, the unit ``unit_id``; always one row per (case, pass)."""
    members = [_Member(run, cuda_visible) for run in runs]
    serial = len(members) > 1 and any(m.case.device == "cuda" for m in members)
    try:
        for pass_name in SPEED_PASSES:
            if not serial:
                _run_pass(members, pass_name, unit_id)
                continue
            for member in members:  # one case on the GPU at a time: its peak not another's pool's
                if pass_name in member.passes:
                    _run_pass([member], pass_name, unit_id)
                    member.release()
    finally:
        for member in members:
            if member.worker is not None:
                member.worker.close()
    return [member.rows.get(p) or failure_rows(member.case, [p], "error", "no result (internal error)")[0]
            for member in members for p in member.passes]


def _peak_main(device: str, dtype: str, threads: int | None, size: int | None,
               cuda_visible: str | None, conn: Any) -> None:
    if cuda_visible is not None:  # the GPU of the unit's slot
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible
    if threads:
        torch.set_num_threads(threads)
    conn.send(matmul_peak_flops(torch.device(device), getattr(torch, dtype), size))


def measure_peak(device: str, dtype: str, threads: int | None, size: int | None = None,
                 cuda_visible: str | None = None, timeout_s: float = 300) -> float:
    """Matmul peak FLOP/s measured in a fresh worker on ``device`` (NaN if it fails)."""
    worker = Worker(_peak_main, (device, dtype, threads, size, cuda_visible))
    try:
        return float(worker.receive(timeout_s))
    except (TimeoutError, WorkerGone):
        return math.nan
    finally:
        worker.kill()
