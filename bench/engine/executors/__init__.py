"""Executors: where units run. One small interface for speed sweeps and training grids alike.

An executor has ``slots`` (how many units may run at once), ``submit(unit)`` and
``wait_any() -> (unit, rows)``. Units are plain data (:class:`bench.speed.cases.SpeedUnit`,
:class:`bench.quality.grid.TrainUnit`); :func:`execute` runs one in the current process
(which starts isolated worker processes of its own) and never raises: a unit that cannot
run returns rows saying why.

- ``local`` (default): on a CPU machine one unit at a time, so timings stay undisturbed; on
  a machine with several GPUs one unit per GPU, each unit's workers seeing only their GPU
  (``CUDA_VISIBLE_DEVICES``).
- ``ray``: see :mod:`bench.engine.executors.ray` (optional extra ``.[ray]``).
"""

from __future__ import annotations

import concurrent.futures as futures
import traceback
from typing import Any, Protocol

import torch

from bench.engine.provenance import ROW_FIELDS, environment


class Unit(Protocol):
    """What an executor runs: plain, picklable data."""

    @property
    def unit_id(self) -> str: ...

    @property
    def device(self) -> str: ...  # "cpu" or "cuda": whose environment the rows are stamped with

    def describe(self) -> str: ...

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]: ...

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]: ...


def execute(unit: Any, cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Run ``unit`` here (its cases in isolated workers); rows, never an exception. Every row
    carries the environment of the machine that ran it (on a cluster: the node's)."""
    try:
        rows = unit.run(cuda_visible)
    except Exception as err:  # a bug in the harness must not lose the unit's rows
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        rows = unit.failure_rows("error", f"harness error running the unit: {last}"[:500])
    stamp_environment(rows, unit.device)
    return rows


def stamp_environment(rows: list[dict[str, Any]], device: str) -> None:
    """Add this machine's environment columns to rows that do not have them yet."""
    env = environment(device, None)
    for row in rows:
        for key in ROW_FIELDS:
            row.setdefault(key, env[key])


class Executor(Protocol):
    """Runs units, ``slots`` at a time."""

    slots: int

    def submit(self, unit: Any) -> None: ...

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]: ...

    def shutdown(self) -> None: ...


class LocalExecutor:
    """Units on this machine: one at a time on CPU, one per GPU on a multi-GPU machine."""

    def __init__(self, device: str = "cpu", gpus: int | None = None) -> None:
        if device == "cuda":
            if gpus is None:
                gpus = torch.cuda.device_count()
            self.slots = max(1, gpus)
        else:
            self.slots = 1
        self.device = device
        self._pool = futures.ThreadPoolExecutor(self.slots) if self.slots > 1 else None
        self._running: dict[futures.Future, tuple[Any, int]] = {}
        self._done: list[tuple[Any, list[dict[str, Any]]]] = []
        self._free = list(range(self.slots))

    def _cuda_visible(self, slot: int) -> str | None:
        return str(slot) if self.device == "cuda" and self.slots > 1 else None

    def submit(self, unit: Any) -> None:
        """Start ``unit`` (on CPU: run it now, in this thread, so Ctrl-C reaches it)."""
        slot = self._free.pop(0)
        if self._pool is None:
            try:
                self._done.append((unit, execute(unit, self._cuda_visible(slot))))
            finally:
                self._free.append(slot)
            return
        future = self._pool.submit(execute, unit, self._cuda_visible(slot))
        self._running[future] = (unit, slot)

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]:
        """The next finished unit and its rows."""
        if self._done:
            return self._done.pop(0)
        finished, _ = futures.wait(self._running, return_when=futures.FIRST_COMPLETED)
        future = next(iter(finished))
        unit, slot = self._running.pop(future)
        self._free.append(slot)
        return unit, future.result()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


EXECUTORS = ("local", "ray")


def make_executor(name: str, *, device: str, address: str | None = None,
                  connect_timeout_s: float | None = None) -> Executor:
    """The executor called ``name`` (``local`` or ``ray``); ``ValueError`` names the allowed ones.
    ``connect_timeout_s``: how long a Ray at ``address`` may take to answer and be joined
    (default :data:`bench.engine.executors.ray.CONNECT_S`)."""
    if name == "local":
        if address is not None:
            raise ValueError("--address: only the 'ray' executor takes an address")
        return LocalExecutor(device)
    if name == "ray":
        # the Ray executor module builds on this one (and on ray, an optional dependency)
        from bench.engine.executors.ray import RayExecutor

        if connect_timeout_s is None:
            return RayExecutor(device=device, address=address)
        return RayExecutor(device=device, address=address, connect_timeout_s=connect_timeout_s)
    raise ValueError(f"--executor: unknown executor {name!r}; allowed values are {list(EXECUTORS)}")
