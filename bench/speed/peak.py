"""The matmul peak that ``peak_fraction`` divides by, taken on the node that runs a unit.

A unit (:class:`bench.speed.unit.SpeedUnit`) carries a :class:`PeakSpec`: the dtype, thread
count and matmul size of the sweep, and the peaks the driver already knows (its
``peak.json``). Where the unit runs (this machine, or a Ray node) :func:`add_node_peak` looks
the peak up by the name of the device the rows are stamped with (:func:`peak_key`), measures
it in a worker of its own when neither the driver nor this process knows it, sets each ok
row's ``peak_fraction`` and hands the peak back to the driver in two private row keys
(:data:`PEAK_KEY`, :data:`PEAK_FLOPS`), which the driver records in ``peak.json`` and drops.
So a GPU sweep driven from a head node without a GPU divides by the GPU's own peak, and a
cluster of mixed devices by each device's.

Each row is divided by the peak of the dtype its kernel computes in
(:func:`row_compute_dtype`): in a float16/bfloat16 sweep, the kernels that upcast half inputs
to float32 (``reference``, ``chunked``, ``blocked``, Nystrom's own implementation:
:func:`attn.registry.kernel_compute_dtype`) are divided by the float32 peak, measured too.
"""

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
    """What identifies a sweep's matmul peak, except the device (known where the unit runs),
    and the peaks the driver has already recorded (``(key, FLOP/s)`` pairs)."""

    device: str
    dtype: str
    threads: int | None = None
    size: int | None = None
    known: tuple[tuple[str, float], ...] = ()


def peak_key(name: str, spec: PeakSpec) -> str:
    """The cache key of the peak of ``spec`` on the device called ``name``: device name,
    dtype, threads and matmul size (``NVIDIA H100 80GB HBM3/bfloat16/default/matmuldefault``)."""
    return (f"{name}/{spec.dtype}/{spec.threads or 'default'}/"
            f"matmul{spec.size or 'default'}")


Measure = Callable[[str, str, "int | None", "int | None", "str | None"], float]


def node_peak(spec: PeakSpec, cuda_visible: str | None = None,
              measure: Measure | None = None) -> tuple[str, float]:
    """``(key, FLOP/s)`` of the peak for ``spec`` on this machine's device: the driver's
    value, else this process's, else measured now (``measure``, default
    :func:`bench.speed.rounds.measure_peak`; NaN when it fails, and then not cached)."""
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
    """The dtype a row's kernel computes in, for a sweep in ``dtype``: float32 for a kernel
    that upcasts half inputs (:func:`attn.registry.kernel_compute_dtype`), else ``dtype``."""
    if dtype not in HALF_DTYPE_NAMES or not row.get("variant") or not row.get("kernel"):
        return dtype
    computed = kernel_compute_dtype(str(row["variant"]), str(row["kernel"]), getattr(torch, dtype))
    return str(computed).removeprefix("torch.")


def add_node_peak(rows: list[dict[str, Any]], spec: PeakSpec,
                  cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """``rows`` (measured here) with ``peak_fraction`` over this device's matmul peak in the
    dtype each row's kernel computes in, and that peak in :data:`PEAK_KEY` /
    :data:`PEAK_FLOPS` for the driver."""
    for row in rows:
        if row.get("status") != "ok":
            continue
        dtype = row_compute_dtype(row, spec.dtype)
        key, peak = node_peak(replace(spec, dtype=dtype), cuda_visible)
        row[PEAK_KEY], row[PEAK_FLOPS] = key, peak
        rate = row.get("tflops")
        if rate is not None and math.isfinite(peak) and peak > 0:
            row["peak_fraction"] = rate * 1e12 / peak
    return rows
