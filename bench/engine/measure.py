"""Measuring one call: its time, its tensor-level and its resident-memory peak (docs/measurement.md)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd import profiler_legacy

from attn.oom import is_oom_error

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")

Call = Callable[[], Any]


@dataclass(frozen=True)
class MemoryReading:
    """Peak bytes above the call's start: tensor-level and (CPU) resident."""

    peak_bytes: int | None
    rss_peak_bytes: int | None


def release_free_memory() -> None:
    """``malloc_trim(0)``, so that VmHWM counts every page the next call touches."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_peak_bytes(call: Call) -> int | None:
    """Resident high-water mark of ``call()`` above the size before it (None without ``clear_refs``)."""
    if not _CLEAR_REFS.exists():
        return None
    release_free_memory()
    _CLEAR_REFS.write_text("5")  # reset VmHWM to the current VmRSS
    baseline = _status_kib("VmRSS")
    call()
    return max(0, _status_kib("VmHWM") - baseline) * 1024


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ log lines) for a moment."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocation_events(call: Call) -> list[tuple[int, int, int]]:
    """``(time_us, order, signed bytes)`` of CPU allocations and frees, by the legacy recorder (starts in ms)."""
    config = profiler_legacy.profile(profile_memory=True).config()
    # quiet: the profiler warns of frees of blocks allocated before it started (the timed calls show the rest)
    with _quiet_stderr():
        profiler_legacy._enable_profiler_legacy(config)
        try:
            call()
        finally:
            records = profiler_legacy._disable_profiler_legacy()
    return sorted((r.start_us(), order, r.cpu_memory_usage())
                  for thread in records for order, r in enumerate(thread)
                  if r.kind() == "memory_alloc")


def _kineto_allocation_events(call: Call) -> list[tuple[int, int, int]]:
    """As :func:`_allocation_events`, read with the kineto profiler (about a second to start)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        call()
    events = prof.profiler.kineto_results.events()  # the raw events: the allocator's are "[memory]"
    return sorted((e.start_ns() // 1000, order, e.nbytes()) for order, e in enumerate(events)
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)


#: calls at least this long (s) are read with kineto from the start: its second to start is small beside them
KINETO_FROM_S = 1.0


def tensor_peak_bytes_cpu(call: Call, call_s: float | None = None) -> int | None:
    """Live peak of the CPU tensor allocations of ``call()`` (docs/measurement.md); None when no reader could."""
    long_call = call_s is not None and call_s >= KINETO_FROM_S
    readers = (_kineto_allocation_events,) if long_call else (_allocation_events, _kineto_allocation_events)
    for reader in readers:
        try:
            return _live_peak(reader(call))
        except Exception as err:
            if not is_oom_error(err):
                raise
    return None


def _live_peak(events: list[tuple[int, int, int]]) -> int:
    """The largest running sum of signed allocation sizes, in time order."""
    live = peak = 0
    for _, _, size in events:
        live += size
        peak = max(peak, live)
    return peak


def tensor_peak_bytes_cuda(call: Call, device: torch.device) -> int:
    """``max_memory_allocated`` during ``call()`` above the allocated bytes before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    call()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - baseline)


def measure_memory(fn: Callable[..., Any], setup: Callable[[], Any] | None,
                   device: torch.device, call_s: float | None = None) -> MemoryReading:
    """Tensor-level and resident peaks of one call each; ``call_s`` picks the CPU reader."""

    def once(reader: Callable[[Call], int | None]) -> int | None:
        arg = setup() if setup is not None else None
        return reader(lambda: fn(arg) if setup is not None else fn())

    if device.type == "cuda":
        return MemoryReading(once(lambda c: tensor_peak_bytes_cuda(c, device)), None)
    return MemoryReading(once(lambda c: tensor_peak_bytes_cpu(c, call_s)), once(rss_peak_bytes))


class CallTimer:
    """Times single calls on one device; ``setup()``'s result is passed to ``fn``."""

    def __init__(self, fn: Callable[..., Any], setup: Callable[[], Any] | None,
                 device: torch.device) -> None:
        self.fn, self.setup, self.device = fn, setup, device
        self.cuda = device.type == "cuda"
        # evicts the L2 cache between CUDA calls
        self._flush = torch.empty(64 * 2**20, dtype=torch.int32, device=device) if self.cuda else None

    def _invoke(self, arg: Any) -> None:
        self.fn(arg) if self.setup is not None else self.fn()

    def time_once(self) -> float:
        """Seconds of one call (after its untimed setup)."""
        arg = self.setup() if self.setup is not None else None
        if not self.cuda:
            start = time.perf_counter()
            self._invoke(arg)
            return time.perf_counter() - start
        self._flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._invoke(arg)
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1e3


def repeats_in_budget(estimate_s: float, *, budget_s: float, minimum: int, maximum: int) -> int:
    """Timed repeats of an ``estimate_s`` call that fit in ``budget_s``, within ``[minimum, maximum]``."""
    fit = int(budget_s / estimate_s) if estimate_s > 0 else maximum
    return max(minimum, min(maximum, fit))


@dataclass(frozen=True)
class WarmUp:
    """Matmul-peak warm-up until two windows' medians agree (two calls in a GPU's slow clock ramp agree too)."""

    min_s: float
    max_s: float
    window_s: float = 0.25
    tolerance: float = 0.02


#: the warm-up per device type: GPUs need seconds to reach steady clocks
WARM_UPS = {"cuda": WarmUp(min_s=2.0, max_s=30.0),
            "cpu": WarmUp(min_s=0.1, max_s=2.0, window_s=0.05, tolerance=0.05)}


def steady_warmup(time_once: Callable[[], float], warm_up: WarmUp) -> list[float]:
    """Call ``time_once`` until ``warm_up`` is satisfied; the median call time of every window."""
    start = time.monotonic()
    medians: list[float] = []
    while True:
        window_start, window = time.monotonic(), []
        while not window or time.monotonic() - window_start < warm_up.window_s:
            window.append(time_once())
        medians.append(statistics.median(window))
        elapsed = time.monotonic() - start
        steady = (len(medians) >= 2 and abs(medians[-1] - medians[-2])
                  <= warm_up.tolerance * min(medians[-2:]))
        if elapsed >= warm_up.max_s or (steady and elapsed >= warm_up.min_s):
            return medians


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None,
                      repeats: int = 5, warm_up: WarmUp | None = None) -> float:
    """Best FLOP/s of a square ``size^3`` matmul on ``device`` after :func:`steady_warmup`."""
    size = size or (8192 if device.type == "cuda" else 4096)
    a = torch.randn(size, size, device=device, dtype=dtype)  # (S, S)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timer = CallTimer(lambda: torch.matmul(a, b), None, device)
    steady_warmup(timer.time_once, warm_up or WARM_UPS.get(device.type, WARM_UPS["cpu"]))
    return 2 * size**3 / min(timer.time_once() for _ in range(repeats))


#: side of the calibration probe's matmul: about 2 ms on an H200 and on 2 CPU cores (docs/measurement.md)
PROBE_SIZES = {"cpu": 512, "cuda": 4096}
#: timed calls of one probe reading (after one warm-up); the reading is the fastest
PROBE_CALLS = 11


def probe_size(device: torch.device) -> int:
    """:data:`PROBE_SIZES` for ``device``."""
    return PROBE_SIZES.get(device.type, PROBE_SIZES["cpu"])


def calibration_probe(device: torch.device, calls: int = PROBE_CALLS, size: int | None = None) -> float:
    """Seconds of the fastest of ``calls`` matmuls after a warm-up; random operands (constant data runs faster)."""
    size = probe_size(device) if size is None else size
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device)  # (S, S)
    cuda = device.type == "cuda"

    def once() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, a)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    once()
    return min(once() for _ in range(calls))


def start_autograd() -> None:
    """One tiny ``backward(grad)``, so autograd's start-up (sympy import, 2-3 s) is not timed."""
    x = torch.ones(2, requires_grad=True)
    (x * 2).backward(torch.ones(2))
