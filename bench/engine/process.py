"""Worker processes that can always be stopped, and the honest name of how one died or failed.

Each worker runs in a process group of its own, so that killing it (a timeout, a stop of
the sweep) also kills whatever it started (compiler workers, subprocesses). A watchdog
thread in the worker kills its group when the driver that started it is gone (checked by
pid and start time, so a reused pid does not fool it): a driver that dies, even by SIGKILL,
leaves nothing running. Workers start from a ``forkserver`` where available (``spawn``
elsewhere), with torch, attn and the module of the first worker's entry point preloaded: a
fresh interpreter state per case, cheap to start.

How a worker ended becomes a status: ``killed`` for a SIGKILL from outside, ``oom`` only when
the kernel's OOM killer reports a kill during the case, ``error`` for a crash (any other
signal, real-time signals included) or a non-zero exit. An exception a worker caught becomes
one too (:func:`failure`): ``unsupported``, ``oom`` (an allocation failure, naming the
address-space cap of :func:`limit_memory` when it refused it) or ``error``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import threading
import time
import traceback
import weakref
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from attn.oom import is_oom_error

POLL_S = 0.25


@cache
def context() -> Any:
    """The multiprocessing context of this process: a forkserver where there is one."""
    if "forkserver" in mp.get_all_start_methods():
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def _preload(ctx: Any, target: Any) -> None:
    """Have the forkserver import torch, attn and ``target``'s module when it starts (read
    once, by the first worker), so that workers start with them imported."""
    if ctx.get_start_method() != "forkserver":
        return
    modules = ["torch", "attn"]
    if getattr(target, "__module__", "__main__") != "__main__":  # a script is not re-imported
        modules.append(target.__module__)
    ctx.set_forkserver_preload(modules)


def limit_memory(max_memory_gb: float | None) -> None:
    """Cap this process's address space (RLIMIT_AS) so that a huge CPU case fails as oom."""
    if max_memory_gb is None:
        return
    cap = int(max_memory_gb * 2**30)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def failure(err: BaseException, device: str, max_memory_gb: float | None = None) -> tuple[str, str]:
    """``(status, reason)`` for an exception a worker on ``device`` caught: ``unsupported``
    (``NotImplementedError``), ``oom`` (naming the per-process address-space cap
    ``max_memory_gb`` of a CPU worker, :func:`limit_memory`, when one was set) or
    ``error``."""
    if isinstance(err, NotImplementedError):
        return "unsupported", str(err)
    last = traceback.format_exception_only(type(err), err)[-1].strip()[:500]
    if not is_oom_error(err):
        return "error", last
    if device == "cpu" and max_memory_gb is not None:
        return "oom", (f"allocation refused by the per-case address-space cap "
                       f"(max_memory_gb={max_memory_gb:g}, RLIMIT_AS): {last}")
    return "oom", last


def signal_name(signum: int) -> str:
    """``SIGKILL``, ``SIGRTMIN+6``, ... for any signal number (never raises)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 34), getattr(signal, "SIGRTMAX", 64)
        if low <= signum <= high:
            return f"SIGRTMIN+{signum - low}"
        return f"signal {signum}"


def oom_kill_count() -> int:
    """Kills by the kernel's OOM killer so far: the system counter and this cgroup's (v2)."""
    total = 0
    for path, key in ((Path("/proc/vmstat"), "oom_kill"),
                      (Path("/sys/fs/cgroup/memory.events"), "oom_kill")):
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    total += int(value)
        except (OSError, ValueError):
            continue
    return total


def death_status(exitcode: int | None, oom_kills_before: int | None = None) -> tuple[str, str]:
    """``(status, reason)`` for a worker that ended with ``exitcode`` without finishing."""
    if exitcode is not None and exitcode < 0:
        name = signal_name(-exitcode)
        if -exitcode == signal.SIGKILL:
            if oom_kills_before is not None and oom_kill_count() > oom_kills_before:
                return "oom", f"worker killed by {name} from the kernel's OOM killer"
            return "killed", (f"worker killed by {name} (not by the memory cap; the kernel "
                              "reports no OOM kill)")
        return "error", f"worker crashed with {name}"
    return "error", f"worker exited with code {exitcode} before finishing"


def process_identity(pid: int) -> tuple[int, int] | None:
    """``(pid, start time in clock ticks)``: names a process even after its pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return pid, int(stat.rsplit(")", 1)[1].split()[19])


def _watch_driver(driver: tuple[int, int] | None) -> None:
    while True:
        time.sleep(POLL_S)
        if driver is not None and process_identity(driver[0]) != driver:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the driver is gone: take the group down


def _run_in_group(target: Any, driver: tuple[int, int] | None, args: tuple[Any, ...],
                  conn: Connection) -> None:
    """Worker entry: own process group, a watchdog on the driver, then ``target(*args, conn)``."""
    os.setpgrp()
    threading.Thread(target=_watch_driver, args=(driver,), daemon=True,
                     name="driver-watchdog").start()
    target(*args, conn)


class WorkerGone(Exception):
    """The worker died; ``status`` and ``reason`` say how."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Worker:
    """One worker process and the pipe to it; ``request`` sends a message and waits."""

    #: workers of this process still running (so that a stopped sweep can kill them all)
    live: ClassVar[weakref.WeakSet[Worker]] = weakref.WeakSet()

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        ctx = context()
        _preload(ctx, target)
        self._conn, child = ctx.Pipe(duplex=True)
        self.oom_kills_before = oom_kill_count()
        driver = process_identity(os.getpid())
        self.process = ctx.Process(target=_run_in_group, args=(target, driver, args, child),
                                   daemon=True)
        self.process.start()
        child.close()
        Worker.live.add(self)

    @property
    def conn(self) -> Connection:
        return self._conn

    def receive(self, timeout_s: float) -> Any:
        """The next message; ``TimeoutError`` after ``timeout_s``; ``WorkerGone`` if it died."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if self._conn.poll(min(remaining, POLL_S)):
                try:
                    return self._conn.recv()
                except (EOFError, OSError):
                    break
            if not self.process.is_alive() and not self._conn.poll(0):
                break
        self.process.join(5)
        raise WorkerGone(*death_status(self.process.exitcode, self.oom_kills_before))

    def request(self, message: Any, timeout_s: float) -> Any:
        """Send ``message`` and return the reply (see :meth:`receive`)."""
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            self.process.join(5)
            raise WorkerGone(*death_status(self.process.exitcode, self.oom_kills_before)) from None
        return self.receive(timeout_s)

    def kill(self) -> None:
        """Kill the worker and its process group (its children too)."""
        pid = self.process.pid
        if pid is not None:
            try:  # the group outlives a dead leader while any of its children run
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                if self.process.is_alive():
                    self.process.kill()
        self.process.join(10)
        Worker.live.discard(self)

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has (killing its group if needed)."""
        try:
            if self.process.is_alive():
                self._conn.send(("exit",))
                self.process.join(5)
        except (BrokenPipeError, OSError):
            pass
        self.kill()
        self._conn.close()


def kill_all_workers() -> None:
    """Kill every worker (and its group) this process started that is still running."""
    for worker in list(Worker.live):
        worker.kill()
