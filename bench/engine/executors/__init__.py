"""Executors: where units run, ``local`` or ``ray`` (a cluster, or a Ray started here; docs/cluster.md)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.engine.executors.base import Executor, Unit, execute, failed
from bench.engine.executors.local import LocalExecutor
from bench.engine.executors.ray import CONNECT_S, RayExecutor

__all__ = ["EXECUTORS", "Executor", "ExecutorSpec", "LocalExecutor", "RayExecutor", "Unit",
           "execute", "failed", "make_executor"]

EXECUTORS = ("local", "ray")


def make_executor(name: str, *, device: str, address: str | None = None,
                  connect_timeout_s: float | None = None) -> Executor:
    """The executor called ``name`` (``local`` or ``ray``); ``ValueError`` names the allowed ones."""
    if name == "local":
        if address is not None:
            raise ValueError("--address: only the 'ray' executor takes an address")
        return LocalExecutor(device)
    if name == "ray":
        return RayExecutor(device=device, address=address,
                           connect_timeout_s=CONNECT_S if connect_timeout_s is None else connect_timeout_s)
    raise ValueError(f"--executor: unknown executor {name!r}; allowed values are {list(EXECUTORS)}")


@dataclass(frozen=True)
class ExecutorSpec:
    """Where a run's units go, by name; the run makes the executor once it has checked its device."""

    name: str = "local"
    address: str | None = None
    connect_timeout_s: float | None = None

    def make(self, device: str) -> Executor:
        return make_executor(self.name, device=device, address=self.address,
                             connect_timeout_s=self.connect_timeout_s)
