"""Scaling analysis per curve and kernel that ran: exponents, crossover, largest N (docs/measurement.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: columns that identify one scaling curve (everything but seq_len)
CURVE = ["label", "variant", "kernel_requested", "causal", "batch", "heads", "kv_heads", "head_dim",
         "dtype", "device", "pass"]
SHAPE = ["causal", "batch", "heads", "kv_heads", "head_dim", "dtype", "device", "pass"]
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


def spread_interval(times_ms: str, time_ms: float, iqr_ms: float) -> tuple[float, float]:
    """A row's 25th-75th percentile of ``times_ms``, else the median +- half the IQR, else the median."""
    values = json.loads(times_ms) if isinstance(times_ms, str) and times_ms else []
    if values:
        q25, q75 = np.percentile(values, [25, 75])
        return float(q25), float(q75)
    half = iqr_ms / 2 if isinstance(iqr_ms, (int, float)) and math.isfinite(iqr_ms) else 0.0
    return time_ms - half, time_ms + half


def _with_intervals(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``low`` and ``high``: each row's :func:`spread_interval`."""
    bounds = [spread_interval(r.times_ms, r.time_ms, r.time_iqr_ms) for r in rows.itertuples()]
    return rows.assign(low=[b[0] for b in bounds], high=[b[1] for b in bounds])


def full_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """The crossover baseline: fastest ok, quiet full-attention ``low``/``high`` per shape and N."""
    full = usable(df[df.variant.isin(BASELINES)])
    if full.empty:
        return pd.DataFrame(columns=["low", "high"])
    fastest = full.loc[full.groupby([*SHAPE, "seq_len"], dropna=False)["time_ms"].idxmin()]
    return _with_intervals(fastest).set_index([*SHAPE, "seq_len"])[["low", "high"]]


@dataclass(frozen=True)
class Side:
    """A curve against full attention at length ``n``: ``faster``, ``slower`` or ``overlap``."""

    n: int
    verdict: str


def _sides(curve: pd.DataFrame, baseline: pd.DataFrame) -> list[Side]:
    """The curve's verdict at every length it shares with the baseline, in order of N."""
    sides = []
    for row in _with_intervals(usable(curve).sort_values("seq_len")).to_dict("records"):
        key = (*(row[c] for c in SHAPE), row["seq_len"])
        if key not in baseline.index:
            continue
        full = baseline.loc[key]
        verdict = ("faster" if row["high"] < full.low else "slower" if row["low"] > full.high
                   else "overlap")
        sides.append(Side(int(row["seq_len"]), verdict))
    return sides


def _not_two(sides: list[Side], want: str) -> str | None:
    """Why ``sides`` are not two ``want`` lengths (``None``: they are)."""
    tied = [str(side.n) for side in sides if side.verdict == "overlap"]
    if tied:
        return f"spreads overlap at N={', '.join(tied)}"
    if len(sides) < 2:
        return f"{want} only at N={sides[0].n}; needs two lengths on each side"
    wrong = next((s for s in sides if s.verdict != want), None)
    if wrong is not None:
        return f"{wrong.verdict} at N={wrong.n}, crossing more than once"
    return None


def noisy_baseline(df: pd.DataFrame) -> pd.Series:
    """How many full-attention rows were left out of the baseline as noisy, per shape and N."""
    full = df[df.variant.isin(BASELINES) & (df.status == "ok") & df.noisy.astype(bool)]
    return full.groupby([*SHAPE, "seq_len"], dropna=False).size()


def _dropped(curve: pd.DataFrame, noisy_full: pd.Series) -> int:
    """Noisy rows left out of ``curve``'s crossover: its own and full attention's at its lengths."""
    ok = curve[curve.status == "ok"]
    own = int(ok.noisy.astype(bool).sum())
    keys = {(*(row[c] for c in SHAPE), row["seq_len"]) for row in ok.to_dict("records")}
    return own + sum(int(noisy_full.get(key, 0)) for key in keys)


def crossover(curve: pd.DataFrame, baseline: pd.DataFrame,
              noisy_full: pd.Series | None = None) -> str:
    """From which N the curve stays faster than full attention of its kind, if shown; noisy rows left out, counted."""
    said = _crossover_said(_sides(curve, baseline))
    dropped = _dropped(curve, noisy_full if noisy_full is not None else pd.Series(dtype=int))
    if said == "-" or not dropped:
        return said
    return f"{said} (left out: {dropped} noisy row{'s' if dropped > 1 else ''})"


def _crossover_said(sides: list[Side]) -> str:
    """:func:`crossover`'s answer from the curve's verdict at each common length."""
    if not sides:
        return "-"
    if len(sides) == 1:
        return (f"not determined: one common length (N={sides[0].n}); needs two lengths on "
                "each side")
    start = len(sides)
    while start > 0 and sides[start - 1].verdict == "faster":
        start -= 1
    if start == len(sides):  # not faster at the largest length
        why = _not_two(sides[-2:], "slower")
        return f"not determined: {why}" if why else f"none up to {sides[-1].n}"
    faster = sides[start:]
    if len(faster) < 2:
        return (f"not determined: faster only at the largest length N={faster[0].n}; needs two "
                "lengths on each side")
    if start == 0:
        return f"< {sides[0].n} (below the range)"
    why = _not_two(sides[max(start - 2, 0):start], "slower")
    if why:
        return f"not determined: faster from N={sides[start].n} on; below it {why}"
    return str(sides[start].n)


def kernel_ran(rows: pd.DataFrame) -> pd.Series:
    """The kernel each row actually ran (``kernel``; the requested one where it is blank)."""
    ran = rows.kernel.fillna("").astype(str)
    return ran.where(ran != "", rows.kernel_requested.astype(str))


def segments(curve: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The curve's ok rows split by the kernel that ran, by smallest N (``[("-", no rows)]``: none)."""
    ok = curve[curve.status == "ok"]
    if ok.empty:
        return [("-", ok)]
    parts = ok.groupby(kernel_ran(ok), sort=False)
    return sorted(((str(k), part) for k, part in parts), key=lambda kp: kp[1].seq_len.min())


def _fitted(ok: pd.DataFrame, points: int, n_range: tuple[int, int] | None) -> pd.DataFrame:
    """The rows an exponent is fitted over: the ``points`` largest N, or those in ``n_range``."""
    return ok.tail(points) if n_range is None else ok[(ok.seq_len >= n_range[0]) & (ok.seq_len <= n_range[1])]


def _segment_row(kernel: str, rows: pd.DataFrame, points: int,
                 n_range: tuple[int, int] | None) -> dict:
    """The fit of one segment: exponents, range, largest N and noisy rows dropped."""
    ok = usable(rows).sort_values("seq_len")
    fitted = _fitted(ok, points, n_range)
    count = max(len(fitted), 1)
    return {
        "kernel": kernel,
        "time_exponent": fit_exponent(fitted.seq_len, fitted.time_ms, count),
        "memory_exponent": fit_exponent(fitted.seq_len, fitted.peak_mem_bytes, count),
        "fit_points": len(fitted),
        "noisy_dropped": len(rows) - len(ok),
        "fit_range": f"{fitted.seq_len.min()}-{fitted.seq_len.max()}" if len(fitted) else "-",
        "max_n": int(ok.seq_len.max()) if len(ok) else None,
        "time_ms_at_max_n": float(ok.time_ms.iloc[-1]) if len(ok) else math.nan,
        "peak_fraction_at_max_n": float(ok.peak_fraction.iloc[-1]) if len(ok) else math.nan,
        "mask_emulated": bool(ok.mask_emulated.any()) if len(ok) else False,
    }


def scaling_table(df: pd.DataFrame, points: int = 4,
                  n_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """A row per curve and kernel that ran, fitted over the ``points`` largest ok N (or ``n_range``)."""
    baseline, noisy_full = full_baseline(df), noisy_baseline(df)
    rows = []
    for key, curve in df.groupby(CURVE, dropna=False, sort=True):
        failed = curve[curve.status.isin(FAILED)]
        whole = {
            **dict(zip(CURVE, key)),
            "first_failure": (f"{failed.seq_len.min()} ({failed.sort_values('seq_len').status.iloc[0]})"
                              if len(failed) else ""),
            "crossover_vs_full": ("-" if key[1] in BASELINES else crossover(curve, baseline, noisy_full)),
        }
        rows += [{**whole, **_segment_row(kernel, part, points, n_range)}
                 for kernel, part in segments(curve)]
    return pd.DataFrame(rows)
