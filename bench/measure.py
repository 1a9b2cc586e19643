"""Measuring one callable: time (median, IQR over repeats) and peak memory above a baseline.

CPU: a ``time.perf_counter`` loop around each call with the thread count set by the worker
(``torch.set_num_threads``); peak memory is the process high-water mark ``VmHWM`` after
resetting it through ``/proc/self/clear_refs``, minus the resident size at the reset (the
inputs and anything else alive). GPU: CUDA events with a 256 MiB L2 flush between repeats;
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` minus the allocated
bytes at the reset. Setup (e.g. the forward before a timed backward) runs outside the timer.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class Measurement:
    """Times in seconds of each timed repeat, the first (warm-up) call and the peak bytes."""

    times_s: tuple[float, ...]
    first_call_s: float
    peak_bytes: int | None

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_s)) * 1e3

    @property
    def iqr_ms(self) -> float:
        q75, q25 = np.percentile(self.times_s, [75, 25])
        return float(q75 - q25) * 1e3


def release_free_memory() -> None:
    """Return glibc's free heap pages to the OS (``malloc_trim(0)``), so that VmHWM counts
    every page the next call touches (otherwise freed tensors kept in the heap hide a peak)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class CpuMemory:
    """Peak resident memory of this process above the resident size at ``reset()``."""

    available = _CLEAR_REFS.exists()

    def reset(self) -> None:
        release_free_memory()
        _CLEAR_REFS.write_text("5")  # reset VmHWM to the current VmRSS
        self.baseline = _status_kib("VmRSS")

    def peak_bytes(self) -> int:
        return max(0, _status_kib("VmHWM") - self.baseline) * 1024


class CudaMemory:
    """Peak allocated CUDA memory above the allocated bytes at ``reset()``."""

    available = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.baseline = torch.cuda.memory_allocated(self.device)

    def peak_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        return max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device,
    repeats: int,
    warmup: int = 1,
    time_budget_s: float = float("inf"),
    setup: Callable[[], object] | None = None,
) -> Measurement:
    """Time ``fn`` (after ``setup``, untimed) ``repeats`` times after ``warmup`` calls.

    ``setup()``'s result is passed to ``fn`` if ``setup`` is given. Repeats are cut down to
    fit ``time_budget_s`` (at least one); the measurement keeps the actual count. Peak
    memory comes from one extra untimed call after the warm-up (free heap pages released
    first), so the timed calls run on a warm allocator; when the first call alone exceeds
    the budget, the single timed call also gives the memory.
    """
    cuda = device.type == "cuda"
    memory = CudaMemory(device) if cuda else CpuMemory()
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device) if cuda else None

    def call(track_memory: bool) -> float:
        arg = setup() if setup is not None else None
        if cuda:
            flush.zero_()  # evict L2 between repeats (as triton.testing.do_bench does)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if track_memory:
                memory.reset()
            start.record()
            fn(arg) if setup is not None else fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / 1e3
        if track_memory:
            memory.reset()
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        return time.perf_counter() - t0

    first = call(False)
    for _ in range(warmup - 1):
        call(False)
    n = repeats if first <= 0 or math.isinf(time_budget_s) else max(
        1, min(repeats, int(time_budget_s / first)))
    peak = None
    separate = memory.available and (n > 1 or first <= time_budget_s / 2)
    if separate:
        call(True)
        peak = memory.peak_bytes()
    times = []
    for index in range(n):
        track = memory.available and not separate and index == 0
        times.append(call(track))
        if track:
            peak = memory.peak_bytes()
    return Measurement(tuple(times), first, peak)


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None,
                      repeats: int = 5) -> float:
    """Best achieved FLOP/s of a square ``size^3`` matmul on ``device`` (the peak reference)."""
    size = size or (8192 if device.type == "cuda" else 4096)
    a = torch.randn(size, size, device=device, dtype=dtype)  # (S, S)
    b = torch.randn(size, size, device=device, dtype=dtype)
    m = measure(lambda: torch.matmul(a, b), device=device, repeats=repeats, warmup=1)
    return 2 * size**3 / min(m.times_s)
