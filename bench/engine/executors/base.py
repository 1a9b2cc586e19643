"""What every executor shares: the unit and executor interfaces, and running a unit here.

An executor has ``slots`` (how many units may run at once), ``submit(unit)`` and
``wait_any() -> (unit, rows)``. Units are plain data (:class:`bench.speed.unit.SpeedUnit`,
:class:`bench.quality.units.TrainUnit`, :class:`bench.quality.reference_unit.ReferenceUnit`);
:func:`execute` runs one in the current process (which starts isolated worker processes of
its own) and never raises: a unit that cannot run returns rows saying why.

Every row an executor returns carries the environment of the machine that ran it (on a
cluster: the node's), stamped once, here: by :func:`execute` where the unit ran, or by
:func:`failed` for a unit an executor could not run or lost (the machine that says so).
"""

from __future__ import annotations

import socket
import traceback
from typing import Any, Protocol

from bench.engine.config import ConfigError, check_device
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
    """Run ``unit`` here (its cases in isolated workers); rows, never an exception, each
    carrying this machine's environment. The unit's device is checked here, on the machine
    that runs it (a cluster's driver need not have it): a machine without it gives ``error``
    rows saying so."""
    try:
        check_device(unit.device)
    except ConfigError as err:
        return failed(unit, "error", f"{socket.gethostname()}: {err}"[:500])
    try:
        rows = unit.run(cuda_visible)
    except Exception as err:  # a bug in the harness must not lose the unit's rows
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return failed(unit, "error", f"harness error running the unit: {last}"[:500])
    return _stamped(rows, unit.device)


def failed(unit: Any, status: str, reason: str) -> list[dict[str, Any]]:
    """``unit.failure_rows(status, reason)`` carrying this machine's environment: the rows
    of a unit that did not run, or whose run was lost (a Ray task that failed)."""
    return _stamped(unit.failure_rows(status, reason), unit.device)


def _stamped(rows: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """``rows`` with this machine's environment columns (those a row does not have yet)."""
    env = environment(device, None)
    for row in rows:
        for key in ROW_FIELDS:
            row.setdefault(key, env[key])
    return rows


class Executor(Protocol):
    """Runs units, ``slots`` at a time; every row it returns carries an environment
    (:func:`execute`, :func:`failed`)."""

    slots: int

    def submit(self, unit: Any) -> None: ...

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]: ...

    def shutdown(self) -> None: ...
