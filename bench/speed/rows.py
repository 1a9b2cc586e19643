"""A row of a speed sweep's ``results.csv``, built in one place (``peak_fraction``: :mod:`bench.speed.peak`)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

from attn import create_attention
from attn.kernels.auto import auto_source
from bench.engine.measure import probe_size
from bench.speed.cases import Case
from bench.speed.noise import noise_columns

Row = dict[str, Any]


def base_row(case: Case, pass_name: str) -> Row:
    """The descriptive columns of a row (before measuring)."""
    return {
        "case_id": case.case_id, "label": case.label, "variant": case.variant,
        "kernel_requested": case.kernel, "kernel": case.kernel,
        "params": case.params_json, "seq_len": case.seq_len, "batch": case.batch,
        "heads": case.heads, "kv_heads": case.key_heads, "head_dim": case.head_dim, "dtype": case.dtype,
        "device": case.device, "causal": case.causal, "pass": pass_name, "packing": case.packing,
    }


def failure_rows(case: Case, passes: tuple[str, ...] | list[str], status: str,
                 reason: str) -> list[Row]:
    """Rows for passes that produced no measurement."""
    return [{**base_row(case, p), "status": status, "reason": reason} for p in passes]


def tflops(flops: float, time_ms: float) -> float:
    """Achieved TFLOP/s (NaN for a zero time)."""
    return flops / (time_ms / 1e3) / 1e12 if time_ms > 0 else math.nan


def timing_columns(times_s: list[float], flops: float) -> Row:
    """Median, IQR and every repeat of a pass's timed calls in ms, and the median's TFLOP/s."""
    times_ms = np.asarray(times_s) * 1e3
    median = float(np.median(times_ms))
    q25, q75 = np.percentile(times_ms, [25, 75])
    return {
        "time_ms": median, "time_iqr_ms": float(q75 - q25), "repeats": len(times_ms),
        "times_ms": json.dumps([float(f"{t:.6g}") for t in times_ms]),
        "tflops": tflops(flops, median),
    }


def kernel_path_text(path: Any) -> str:
    """The ``kernel_path`` column: the path, and a dispatching kernel's backend (``... [backend: flash]``)."""
    if path is None:
        return ""
    backend = getattr(path, "backend", None)
    return f"{path.path} [backend: {backend}]" if backend else path.path


def path_columns(paths: list[Any], case: Case) -> Row:
    """Row columns from the ``KernelPath`` of every call of a pass."""
    seen = [p for p in paths if p is not None]
    last = seen[-1] if seen else None
    return {
        "kernel": last.kernel if last else case.kernel,
        "kernel_path": kernel_path_text(last),
        "mask_emulated": bool(last and last.mask_emulated),
        "fallback": "; ".join(sorted({p.fallback for p in seen if p.fallback})),
        "compile_ms": sum(p.compile_s or 0.0 for p in seen) * 1e3,
        "setup_ms": sum(p.setup_s or 0.0 for p in seen) * 1e3,
        "setup_mem_bytes": sum(p.setup_bytes or 0 for p in seen),
        "auto_source": auto_source_column(case),
    }


def auto_source_column(case: Case) -> str:
    """Where ``auto``'s order came from (``default``, ``default: <why>``, ``tuned:<sha>``); "" for a named kernel."""
    if case.kernel != "auto":
        return ""
    pattern = create_attention(case.variant, num_heads=case.heads, head_dim=case.head_dim,
                               **case.params_dict).pattern()
    return auto_source(pattern, case.device, getattr(torch, case.dtype))


def measured_row(case: Case, pass_name: str, built: Row, prepared: Row, finished: Row,
                 times_s: list[float], unit_id: str, interleaved: int,
                 probes_s: tuple[float, ...] = ()) -> Row:
    """The ``ok`` row of a pass from the worker's replies, times and probes (the slow-state flag: the driver's)."""
    flops = built["flops"][pass_name]
    timing = timing_columns(times_s, flops)
    noise = noise_columns(np.asarray(times_s) * 1e3, [p * 1e3 for p in probes_s],
                          case.noise_threshold)
    return {
        **base_row(case, pass_name), "status": "ok", "reason": "",
        **{k: v for k, v in built.items() if k != "flops"}, "flops": flops,
        **prepared, **finished, **timing, **noise,
        "probe_size": probe_size(torch.device(case.device)),  # the worker's probe
        "interleave_id": unit_id, "interleaved": interleaved,
    }

