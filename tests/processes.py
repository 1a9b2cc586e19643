"""Helpers for tests that watch processes die: liveness (:func:`attn.supervise.alive`), and polling."""

from __future__ import annotations

import time
from collections.abc import Callable

from attn.supervise import alive as alive  # re-exported: a zombie counts as dead


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 0.1 s until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
