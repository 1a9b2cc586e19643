"""The ``local`` executor: one unit at a time on a CPU (timings undisturbed), one per GPU (``CUDA_VISIBLE_DEVICES``)."""

from __future__ import annotations

import concurrent.futures as futures
import os
from typing import Any

import torch

from bench.engine.executors.base import execute


def slot_device(slot: int, parent: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` of GPU slot ``slot``: the ``slot``-th of the ``parent``'s, else ``str(slot)``."""
    if parent is None or not parent.strip():
        return str(slot)
    listed = [d.strip() for d in parent.split(",") if d.strip()]
    if slot >= len(listed):
        raise ValueError(f"GPU slot {slot} has no device: CUDA_VISIBLE_DEVICES={parent!r} lists "
                         f"{len(listed)}")
    return listed[slot]


class LocalExecutor:
    """Units on this machine: one at a time on CPU, one per GPU on a multi-GPU machine."""

    def __init__(self, device: str = "cpu", gpus: int | None = None) -> None:
        if device == "cuda" and gpus is None:
            gpus = torch.cuda.device_count()
        self.slots = max(1, gpus) if device == "cuda" else 1
        self.device = device
        self._pool = futures.ThreadPoolExecutor(self.slots) if self.slots > 1 else None
        self._running: dict[futures.Future, tuple[Any, int]] = {}
        self._done: list[tuple[Any, list[dict[str, Any]]]] = []
        self._free = list(range(self.slots))

    def _cuda_visible(self, slot: int) -> str | None:
        """The device the slot's workers see; None (inherit the parent's) for a single slot."""
        if self.device != "cuda" or self.slots <= 1:
            return None
        return slot_device(slot, os.environ.get("CUDA_VISIBLE_DEVICES"))

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
