"""The matmul peak that ``peak_fraction`` divides by, taken on the node that runs a unit (docs/measurement.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from attn.registry import kernel_compute_dtype
from bench.engine.provenance import device_name
from bench.speed import rounds

#: private row keys carrying the node's peak back to the driver (never written to a file)
PEAK_KEY, PEAK_FLOPS = "_peak_key", "_peak_flops"

#: peaks measured by this process, by :func:`peak_key` (a Ray worker runs many units)
_MEASURED: dict[str, float] = {}


@dataclass(frozen=True)
class PeakSpec:
    """A sweep's matmul peak but for the device (known where the unit runs), and the driver's known peaks."""

    device: str
    dtype: str
    threads: int | None = None
    size: int | None = None
    known: tuple[tuple[str, float], ...] = ()


def peak_key(name: str, spec: PeakSpec) -> str:
    """``NAME/DTYPE/THREADS/matmulSIZE``, the cache key of ``spec``'s peak on the device ``name``."""
    return (f"{name}/{spec.dtype}/{spec.threads or 'default'}/"
            f"matmul{spec.size or 'default'}")


Measure = Callable[[str, str, "int | None", "int | None", "str | None"], float]


def node_peak(spec: PeakSpec, cuda_visible: str | None = None,
              measure: Measure | None = None) -> tuple[str, float]:
    """``(key, FLOP/s)`` for ``spec`` here: the driver's, else this process's, else measured now (NaN: failed)."""
    key = peak_key(device_name(spec.device), spec)
    known = dict(spec.known)
    if key in known and math.isfinite(known[key]):
        return key, known[key]
    if key not in _MEASURED:
        measure = measure or rounds.measure_peak  # looked up per call: a test may replace it
        value = float(measure(spec.device, spec.dtype, spec.threads, spec.size, cuda_visible))
        if not math.isfinite(value):
            return key, value
        _MEASURED[key] = value
    return key, _MEASURED[key]


#: sweep dtypes whose cases may run on kernels that compute in float32
HALF_DTYPE_NAMES = ("float16", "bfloat16")


def row_compute_dtype(row: dict[str, Any], dtype: str) -> str:
    """float32 for a kernel that upcasts the sweep's half ``dtype``, else ``dtype``."""
    if dtype not in HALF_DTYPE_NAMES or not row.get("variant") or not row.get("kernel"):
        return dtype
    computed = kernel_compute_dtype(str(row["variant"]), str(row["kernel"]), getattr(torch, dtype))
    return str(computed).removeprefix("torch.")


def add_node_peak(rows: list[dict[str, Any]], spec: PeakSpec,
                  cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """``rows`` with ``peak_fraction`` over this device's peak in the kernel's compute dtype, and that peak."""
    for row in rows:
        if row.get("status") != "ok":
            continue
        key, peak = node_peak(replace(spec, dtype=row_compute_dtype(row, spec.dtype)), cuda_visible)
        row[PEAK_KEY], row[PEAK_FLOPS] = key, peak
        rate = row.get("tflops")
        if rate is not None and math.isfinite(peak) and peak > 0:
            row["peak_fraction"] = rate * 1e12 / peak
    return rows
