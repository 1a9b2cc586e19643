"""The ``ray`` executor: a Ray task per unit (docs/cluster.md); a Ray this process joined before is used as it is."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.engine.executors.base import execute, failed
from bench.engine.executors.ray_connect import (
    AUTH_MODE,
    CONNECT_S,
    ConnectTimeoutError,
    check_reachable,
    connect_error,
    first_line,
    init_within,
)
from bench.engine.messages import shown

DEVICES = ("cpu", "cuda")
#: custom Ray resource marking the nodes that take speed units (one unit per unit of it)
NODE_RESOURCE = "attn_bench_node"
#: object store of a Ray started here: rows are small, the memory belongs to the cases
OBJECT_STORE_BYTES = 100 * 2**20
#: times Ray runs a task again after a system failure (a lost worker or node)
MAX_RETRIES = 1
#: a Ray started here: workers at normal priority, bounded retries after Ray's memory monitor kills one
LOCAL_RAY_CONFIG = {"worker_niceness": 0, "task_oom_retries": MAX_RETRIES}
#: ``wait_any`` polls and sleeps in Python: a blocking ``ray.wait`` turns a signal handler's
#: KeyboardInterrupt("SIGTERM") into a bare KeyboardInterrupt
POLL_S = 0.05
#: how often ``wait_any`` checks that some node can still run units
CHECK_S = 5.0
INSTALL_HINT = "the ray executor needs Ray: pip install 'attn-bench[ray]'"
_UNSET = object()


class RayMissingError(ImportError, ValueError):
    """Ray is not installed (a ``ValueError`` too, so the CLI prints one line)."""


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayMissingError` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RayMissingError(INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class Reservation:
    """What the task of one unit asks Ray for, and how many such tasks fit the cluster."""

    num_cpus: float
    num_gpus: float
    resources: dict[str, float] = field(default_factory=dict)
    slots: int = 1
    warning: str = ""  # nodes left idle, said once when the executor starts

    @property
    def needs(self) -> dict[str, float]:
        """What one task asks for, by Ray's resource names."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}


def reservation_for(device: str, nodes: list[dict[str, Any]]) -> Reservation:
    """One unit's task's reservation on a cluster of ``nodes`` (``ray.nodes()``); ``ValueError``: no node can run it."""
    if device not in DEVICES:
        raise ValueError(f"device: unknown value {device!r}; allowed values are {list(DEVICES)}")
    alive = [n for n in nodes if n.get("Alive") and n.get("Resources")]
    if device == "cuda":
        gpus = int(sum(n["Resources"].get("GPU", 0) for n in alive))
        if gpus < 1:
            raise ValueError("device 'cuda': the Ray cluster has no GPU; start the workers on GPU "
                             "machines or use device 'cpu'")
        return Reservation(num_cpus=0, num_gpus=1, slots=gpus)
    marked = [n for n in alive if n["Resources"].get(NODE_RESOURCE, 0) >= 1]
    if marked:
        cpus = min(n["Resources"].get("CPU", 0) for n in marked)
        slots = int(sum(n["Resources"][NODE_RESOURCE] for n in marked))
        return Reservation(num_cpus=cpus, num_gpus=0, resources={NODE_RESOURCE: 1}, slots=slots)
    sizes = [(str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or n["NodeID"]),
              n["Resources"].get("CPU", 0)) for n in alive]
    sizes = [(name, cpus) for name, cpus in sizes if cpus >= 1]
    if not sizes:
        raise ValueError("device 'cpu': the Ray cluster has no node with a CPU to run units on")
    largest = max(cpus for _, cpus in sizes)
    idle = sorted(name for name, cpus in sizes if cpus < largest)
    warning = ""
    if idle:
        warning = (f"Ray nodes {idle} have fewer CPUs than the largest ({largest:g}) and run no "
                   f"unit; start every node with --resources='{{\"{NODE_RESOURCE}\": 1}}' to "
                   "use them all (one timed unit per node)")
    return Reservation(num_cpus=largest, num_gpus=0, slots=len(sizes) - len(idle), warning=warning)


def fits(node: dict[str, Any], reservation: Reservation) -> bool:
    """True when ``node`` (an entry of ``ray.nodes()``) is alive and can hold one such task."""
    have = node.get("Resources") or {}
    return bool(node.get("Alive")) and all(have.get(k, 0) >= v for k, v in reservation.needs.items() if v)


def _thread_env_as_started() -> None:
    """Drop the ``OMP_NUM_THREADS`` Ray sets for a task unless the worker started with one."""
    try:
        with open("/proc/self/environ", "rb") as f:
            started = f.read().split(b"\0")
    except OSError:
        return
    if not any(item.startswith(b"OMP_NUM_THREADS=") for item in started):
        os.environ.pop("OMP_NUM_THREADS", None)


def _normal_priority() -> None:
    """Undo Ray's worker niceness (15) where allowed; otherwise start nodes with ``RAY_worker_niceness=0``."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)


def run_unit_task(unit: Any, gpu: bool) -> list[dict[str, Any]]:
    """Body of the Ray task of one unit: :func:`execute` here, on the GPU Ray assigned."""
    _thread_env_as_started()
    _normal_priority()
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES") if gpu else None
    return execute(unit, cuda_visible)  # stamped with this node's environment


def failure_status(err: BaseException) -> tuple[str, str]:
    """``(status, reason)`` for a unit whose Ray task failed with ``err``."""
    import ray.exceptions as rex  # Ray: an optional extra, imported only with an executor

    if isinstance(err, rex.RayTaskError):  # the task body raised (e.g. the unit did not unpickle)
        cause = err.cause if err.cause is not None else err
        return "error", f"Ray task failed: {type(cause).__name__}: {first_line(str(cause))}"[:500]
    said = f"Ray reported {type(err).__name__}: {first_line(str(err))}"
    if isinstance(err, rex.OutOfMemoryError):
        return "oom", f"{said} (killed by Ray's memory monitor)"[:500]
    if isinstance(err, rex.TaskCancelledError):
        return "killed", f"{said} (the task was cancelled)"[:500]
    lost = (rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError,
            rex.LocalRayletDiedError)
    if isinstance(err, lost):
        return "killed", f"{said} (after {MAX_RETRIES} retry)"[:500]
    return "error", said[:500]


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` meanwhile, unless it is set already."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


class RayExecutor:
    """Units as Ray tasks on the cluster at ``address`` (left running) or on a Ray started here (stopped at the end)."""

    def __init__(self, device: str = "cpu", address: str | None = None, *,
                 num_cpus: int | None = None,
                 object_store_memory: int = OBJECT_STORE_BYTES,
                 connect_timeout_s: float = CONNECT_S) -> None:
        if device not in DEVICES:
            raise ValueError(f"device: unknown value {device!r}; allowed values are {list(DEVICES)}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"--address: expected HOST:PORT of a Ray head node; got {address!r}")
        if not (isinstance(connect_timeout_s, (int, float)) and connect_timeout_s > 0):
            raise ValueError(f"--connect-timeout-s: must be a number > 0; got "
                             f"{shown(connect_timeout_s)}")
        self.connect_timeout_s = float(connect_timeout_s)
        if address is not None and num_cpus is not None:
            raise ValueError("num_cpus: only for a Ray started here (no --address); a cluster's "
                             "nodes say their own CPU counts")
        self._ray = import_ray()
        self.device = device
        self._auth_mode: Any = _UNSET  # RAY_AUTH_MODE before a Ray started here
        self._own = self._connect(address, num_cpus, object_store_memory)
        self._running: dict[Any, Any] = {}  # Ray object ref -> unit
        self._done: list[tuple[Any, list[dict[str, Any]]]] = []
        self._last_check = time.monotonic()
        try:
            self.reservation = reservation_for(device, self._ray.nodes())
            self._task = self._ray.remote(run_unit_task)
        except BaseException:
            self._disconnect()
            raise
        if self.reservation.warning:
            warnings.warn(self.reservation.warning, stacklevel=2)
        self.slots = self.reservation.slots

    def _connect(self, address: str | None, num_cpus: int | None,
                 object_store_memory: int) -> bool:
        """Join Ray; True when this executor started or connected it (and so leaves it)."""
        ray = self._ray
        if ray.is_initialized():
            return False
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
        if address is None:
            # Ray turns token authentication on through this variable: put it back when Ray stops
            self._auth_mode = os.environ.get(AUTH_MODE)
            with _env_default("RAY_USAGE_STATS_ENABLED", "0"):
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         object_store_memory=object_store_memory,
                         _system_config=dict(LOCAL_RAY_CONFIG), **quiet)
            return True
        check_reachable(address, self.connect_timeout_s)
        try:
            init_within(ray, self.connect_timeout_s, address, **quiet)
        except ConnectTimeoutError:
            raise
        except Exception as err:  # ConnectionError, AuthenticationError, ... from Ray
            raise ValueError(connect_error(address, err)) from None
        return True

    def _disconnect(self) -> None:
        if self._own and self._ray.is_initialized():
            self._ray.shutdown()
            if self._auth_mode is None:
                os.environ.pop(AUTH_MODE, None)
            elif self._auth_mode is not _UNSET:
                os.environ[AUTH_MODE] = self._auth_mode
        self._own = False

    def submit(self, unit: Any) -> None:
        """Start ``unit`` as a Ray task (it waits in Ray's queue until a node or GPU is free)."""
        res = self.reservation
        options = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_retries": MAX_RETRIES}
        if res.resources:
            options["resources"] = dict(res.resources)
        try:
            ref = self._task.options(**options).remote(unit, res.num_gpus > 0)
        except Exception as err:  # the unit could not be sent (not picklable, ...)
            reason = f"Ray could not start the unit: {type(err).__name__}: {first_line(str(err))}"
            self._done.append((unit, failed(unit, "error", reason[:500])))
            return
        self._running[ref] = unit

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]:
        """The next finished unit and its rows (failure rows when Ray lost it)."""
        if self._done:
            return self._done.pop(0)
        if not self._running:
            raise RuntimeError("wait_any: no unit is running (submit one first)")
        while True:
            ready, _ = self._ray.wait(list(self._running), num_returns=1, timeout=0)
            if ready:
                return self._collect(ready[0])
            time.sleep(POLL_S)
            if time.monotonic() - self._last_check >= CHECK_S:
                self._last_check = time.monotonic()
                lost = self._fail_if_no_node()
                if lost is not None:
                    return lost


    def _collect(self, ref: Any) -> tuple[Any, list[dict[str, Any]]]:
        unit = self._running.pop(ref)
        try:
            return unit, self._ray.get(ref)
        except self._ray.exceptions.RayError as err:
            return unit, failed(unit, *failure_status(err))

    def _fail_if_no_node(self) -> tuple[Any, list[dict[str, Any]]] | None:
        """When no node can run units any more, end the running units as failure rows (not wait forever)."""
        if any(fits(node, self.reservation) for node in self._ray.nodes()):
            return None
        needs = ", ".join(f"{k} {v:g}" for k, v in self.reservation.needs.items() if v)
        reason = f"no live Ray node can run the unit any more (each needs {needs}); the nodes that could were lost"
        for ref, unit in list(self._running.items()):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
            self._done.append((unit, failed(unit, "killed", reason)))
        self._running.clear()
        return self._done.pop(0) if self._done else None

    def shutdown(self) -> None:
        """Cancel what still runs (its workers killed) and leave a Ray this executor joined."""
        if self._ray.is_initialized():
            for ref in list(self._running):
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
        self._running.clear()
        self._disconnect()
