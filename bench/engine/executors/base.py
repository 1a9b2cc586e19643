"""The unit and executor interfaces, and running a unit here: the one place rows get their machine's environment."""

from __future__ import annotations

import socket
import traceback
from typing import Any, Protocol

from bench.engine.config import ConfigError, check_device
from bench.engine.provenance import ROW_FIELDS, environment


class Unit(Protocol):
    """What an executor runs: plain, picklable data."""

    unit_id: str
    device: str  # "cpu" or "cuda": whose environment the rows are stamped with

    def describe(self) -> str: ...

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]: ...

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]: ...


def execute(unit: Any, cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Run ``unit`` here; rows, never an exception. The device is checked here, not on a cluster's driver."""
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
    """``unit.failure_rows(status, reason)`` stamped with this machine's environment."""
    return _stamped(unit.failure_rows(status, reason), unit.device)


def _stamped(rows: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """``rows`` with this machine's environment columns (those a row does not have yet)."""
    env = environment(device, None)
    for row in rows:
        for key in ROW_FIELDS:
            row.setdefault(key, env[key])
    return rows


class Executor(Protocol):
    """Runs units, ``slots`` at a time: ``submit(unit)``, ``wait_any() -> (unit, rows)``, ``shutdown()``."""

    slots: int

    def submit(self, unit: Any) -> None: ...

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]: ...

    def shutdown(self) -> None: ...
