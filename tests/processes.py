"""Helpers for tests that watch processes die: liveness read from ``/proc``, and polling."""

from __future__ import annotations

import time
from collections.abc import Callable


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped) counts as dead, and so does a
    process reaped while we look (its ``/proc`` entry vanishing between two reads is not an
    error: checking existence first and reading the state second raced with the reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 0.1 s until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
