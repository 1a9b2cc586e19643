"""Child processes that can always be stopped: from a forkserver preloading torch and attn, each in its own
process group with a watchdog that kills the group when its parent (pid and start time) is gone. Imports no torch."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

POLL_S = 0.25


def context(target: Callable[..., Any]) -> Any:
    """A forkserver context preloading torch, attn and ``target``'s module (read once); else ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    module = getattr(target, "__module__", "__main__")  # a script is not re-imported
    ctx.set_forkserver_preload(["torch", "attn", *([module] if module != "__main__" else [])])
    return ctx


def identity(pid: int) -> tuple[int, int] | None:
    """``(pid, start time)`` of a running, non-zombie process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:  # one read: the entry may vanish between two
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (pid, int(fields[19]))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    return identity(pid) is not None


def signal_name(signum: int) -> str:
    """``SIGKILL``, ``SIGRTMIN+6``, ... for any signal number (never raises)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 34), getattr(signal, "SIGRTMAX", 64)
        return f"SIGRTMIN+{signum - low}" if low <= signum <= high else f"signal {signum}"


def watch_parent(parent: tuple[int, int] | None) -> None:
    """Kill this process's group as soon as ``parent`` (an :func:`identity`) is gone."""
    while parent is not None:
        time.sleep(POLL_S)
        if identity(parent[0]) != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _in_group(parent: tuple[int, int] | None, target: Callable[..., Any], *args: Any) -> None:
    """Child entry: a process group of its own, a watchdog on ``parent``, then ``target(*args)``."""
    os.setpgrp()
    threading.Thread(target=watch_parent, args=(parent,), daemon=True, name="parent-watchdog").start()
    target(*args)


class ChildGone(Exception):
    """The child ended before sending the message waited for."""


class Child:
    """A child process running ``target(*args, conn)`` in its own group, and ``conn`` to it."""

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
        ctx = context(target)
        self.conn: Connection
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_in_group, daemon=True,
                                   args=(identity(os.getpid()), target, *args, child))
        self.process.start()
        child.close()

    def receive(self, timeout_s: float) -> Any:
        """The next message; ``TimeoutError`` after ``timeout_s``; ``ChildGone`` if the child ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if self.conn.poll(min(remaining, POLL_S)):
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    break
            if not self.process.is_alive() and not self.conn.poll(0):
                break
        self.process.join(5)
        raise ChildGone

    def kill(self) -> None:
        """Kill the child and its process group (whatever it started)."""
        if self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group outlives
                os.killpg(self.process.pid, signal.SIGKILL)  # a dead leader while its children run
            if self.process.is_alive():
                self.process.kill()
        self.process.join(10)

