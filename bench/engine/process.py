"""Worker processes that can always be stopped, and the honest name of how one died or failed."""

from __future__ import annotations

import contextlib
import resource
import signal
import traceback
import weakref
from pathlib import Path
from typing import Any, ClassVar

from attn.oom import is_oom_error
from attn.supervise import Child, ChildGone, signal_name


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
    """``(status, reason)`` for a caught exception: ``unsupported``, ``oom`` (naming a CPU cap) or ``error``."""
    if isinstance(err, NotImplementedError):
        return "unsupported", str(err)
    last = traceback.format_exception_only(type(err), err)[-1].strip()[:500]
    if not is_oom_error(err):
        return "error", last
    if device == "cpu" and max_memory_gb is not None:
        return "oom", (f"allocation refused by the per-case address-space cap "
                       f"(max_memory_gb={max_memory_gb:g}, RLIMIT_AS): {last}")
    return "oom", last


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


class WorkerGone(Exception):
    """The worker died; ``status`` and ``reason`` say how."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Worker(Child):
    """One worker process and the pipe to it; ``request`` sends a message and waits."""

    #: workers of this process still running (so that a stopped sweep can kill them all)
    live: ClassVar[weakref.WeakSet[Worker]] = weakref.WeakSet()

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        self.oom_kills_before = oom_kill_count()
        super().__init__(target, args)
        Worker.live.add(self)

    def _gone(self) -> WorkerGone:
        return WorkerGone(*death_status(self.process.exitcode, self.oom_kills_before))

    def receive(self, timeout_s: float) -> Any:
        """The next message; ``TimeoutError`` after ``timeout_s``; ``WorkerGone`` if it died."""
        try:
            return super().receive(timeout_s)
        except ChildGone:
            raise self._gone() from None

    def request(self, message: Any, timeout_s: float) -> Any:
        """Send ``message`` and return the reply (see :meth:`receive`)."""
        try:
            self.conn.send(message)
        except (BrokenPipeError, OSError):
            self.process.join(5)
            raise self._gone() from None
        return self.receive(timeout_s)

    def kill(self) -> None:
        """Kill the worker and its process group (its children too)."""
        super().kill()
        Worker.live.discard(self)

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has (killing its group if needed)."""
        with contextlib.suppress(OSError):  # a broken pipe: it is gone already
            if self.process.is_alive():
                self.conn.send(("exit",))
                self.process.join(5)
        self.kill()
        self.conn.close()


def kill_all_workers() -> None:
    """Kill every worker (and its group) this process started that is still running."""
    for worker in list(Worker.live):
        worker.kill()
