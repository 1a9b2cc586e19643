"""Scaling analysis: fitted exponents of time and memory against N, crossover against full
attention of the same kind (causal with causal), and the largest N reached, per curve.

Memory exponents use the tensor-level peak (``peak_mem_bytes``), not the resident peak. Rows
flagged noisy (:mod:`bench.speed.noise`) are left out of fits and crossovers, and each curve
says how many it dropped (``noisy_dropped``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: columns that identify one scaling curve (everything but seq_len)
CURVE = ["label", "variant", "kernel_requested", "causal", "batch", "heads", "head_dim",
         "dtype", "device", "pass"]
SHAPE = ["causal", "batch", "heads", "head_dim", "dtype", "device", "pass"]
FAILED = ("oom", "timeout", "error")


def fit_exponent(n: pd.Series, y: pd.Series, points: int = 4) -> float:
    """Slope of log(y) against log(N) by least squares over the ``points`` largest N (NaN if < 2)."""
    data = pd.DataFrame({"n": n.astype(float), "y": y.astype(float)})
    data = data[(data.y > 0) & np.isfinite(data.y)].sort_values("n").tail(points)
    if data.n.nunique() < 2:
        return math.nan
    return float(np.polyfit(np.log(data.n), np.log(data.y), 1)[0])


#: variants whose curves are the full-attention baseline (non-causal and causal)
BASELINES = ("full", "causal")


def usable(df: pd.DataFrame) -> pd.DataFrame:
    """The rows fits and crossovers use: ``ok`` and not flagged noisy."""
    return df[(df.status == "ok") & ~df.noisy.astype(bool)]


def full_baseline(df: pd.DataFrame) -> pd.Series:
    """Fastest ok, quiet full-attention time per shape and N (over its kernels): the crossover
    baseline. Causal rows (``causal``, or ``full`` run causally) are the causal baseline."""
    full = usable(df[df.variant.isin(BASELINES)])
    return full.groupby([*SHAPE, "seq_len"], dropna=False)["time_ms"].min().rename("full_ms")


def crossover(curve: pd.DataFrame, baseline: pd.Series) -> str:
    """From which N the curve stays faster than full attention of the same kind.

    A causal curve is compared with causal full attention, a non-causal one with non-causal
    full attention, at the lengths both measured. Returns the length as text, ``"< N0 (below
    the range)"`` when the curve is faster at every common length N0..., ``"none up to N1"``
    when it is slower at the largest common length, ``"-"`` without a common length.
    """
    ok = usable(curve).sort_values("seq_len")
    pairs = []
    for _, row in ok.iterrows():
        full = baseline.get((*(row[c] for c in SHAPE), row.seq_len), math.nan)
        if not math.isnan(full):
            pairs.append((int(row.seq_len), row.time_ms < full))
    if not pairs:
        return "-"
    if not pairs[-1][1]:
        return f"none up to {pairs[-1][0]}"
    index = len(pairs) - 1
    while index > 0 and pairs[index - 1][1]:
        index -= 1
    if index == 0:
        return f"< {pairs[0][0]} (below the range)"
    return str(pairs[index][0])


def scaling_table(df: pd.DataFrame, points: int = 4,
                  n_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per curve: exponents, fitted range, largest N reached, first failure, crossover.

    Exponents are fitted over the ``points`` largest ok N, or, with ``n_range = (lo, hi)``,
    over every ok N with ``lo <= N <= hi``; rows flagged noisy are left out of both and
    counted (``noisy_dropped``).
    """
    baseline = full_baseline(df)
    rows = []
    for key, curve in df.groupby(CURVE, dropna=False, sort=True):
        ok = usable(curve).sort_values("seq_len")
        noisy = int((curve.status == "ok").sum()) - len(ok)
        failed = curve[curve.status.isin(FAILED)]
        if n_range is None:
            fitted = ok.tail(points)
        else:
            fitted = ok[(ok.seq_len >= n_range[0]) & (ok.seq_len <= n_range[1])]
        count = max(len(fitted), 1)
        rows.append({
            **dict(zip(CURVE, key)),
            "kernel": ",".join(sorted(set(ok.kernel) - {""})) or "-",
            "time_exponent": fit_exponent(fitted.seq_len, fitted.time_ms, count),
            "memory_exponent": fit_exponent(fitted.seq_len, fitted.peak_mem_bytes, count),
            "fit_points": len(fitted),
            "noisy_dropped": noisy,
            "fit_range": f"{fitted.seq_len.min()}-{fitted.seq_len.max()}" if len(fitted) else "-",
            "max_n": int(ok.seq_len.max()) if len(ok) else None,
            "time_ms_at_max_n": float(ok.time_ms.iloc[-1]) if len(ok) else math.nan,
            "peak_fraction_at_max_n": float(ok.peak_fraction.iloc[-1]) if len(ok) else math.nan,
            "first_failure": (f"{failed.seq_len.min()} ({failed.sort_values('seq_len').status.iloc[0]})"
                              if len(failed) else ""),
            "crossover_vs_full": ("-" if key[1] in BASELINES else crossover(curve, baseline)),
            "mask_emulated": bool(ok.mask_emulated.any()) if len(ok) else False,
        })
    return pd.DataFrame(rows)
