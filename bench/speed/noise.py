"""Noise: whether a speed row was measured under contention, and the columns that say so.

Two readings per ``ok`` row, both kept in the row:

- ``time_spread``: the relative spread of its timed repeats, interquartile range over median
  (a quiet CPU run stays within a few percent; a busy machine gives repeats such as
  [687, 93, 166] ms, a spread of 1.8);
- ``probe_ms``: a calibration probe, a fixed small matmul
  (:func:`bench.engine.measure.calibration_probe`) timed in the case's worker right before
  and right after the pass's timed rounds: ``[before, after]``. Its change
  (``max / min - 1``) says the machine's load changed while the case ran.

A row is ``noisy`` when either exceeds the run's ``noise_threshold`` (a sweep config key,
default :data:`DEFAULT_THRESHOLD`). Fits and crossovers (:mod:`bench.speed.scaling`) leave
noisy rows out; the report says so at its top; ``attn-bench sweep --retry-noisy`` measures
them again. Rows written before the flag existed are judged by their repeats' spread under
the default threshold (they have no probe).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: the default noise policy: a row whose spread or probe change exceeds this is noisy
DEFAULT_THRESHOLD = 0.25


def relative_spread(times_ms: list[float] | np.ndarray) -> float:
    """Interquartile range over median of ``times_ms`` (NaN without a positive median)."""
    times = np.asarray(times_ms, dtype=float)
    if times.size == 0:
        return math.nan
    median = float(np.median(times))
    if not median > 0:
        return math.nan
    q25, q75 = np.percentile(times, [25, 75])
    return float(q75 - q25) / median


def probe_change(probe_ms: list[float]) -> float:
    """How much the calibration probe changed across a pass: ``max / min - 1`` (NaN without
    two positive readings)."""
    values = [float(p) for p in probe_ms if p is not None and math.isfinite(p) and p > 0]
    if len(values) < 2:
        return math.nan
    return max(values) / min(values) - 1.0


def why_noisy(spread: float, change: float, threshold: float) -> str:
    """Why a row with this spread and probe change is noisy under ``threshold`` (``""``:
    it is not)."""
    reasons = []
    if math.isfinite(spread) and spread > threshold:
        reasons.append(f"spread {spread:.0%} > {threshold:.0%}")
    if math.isfinite(change) and change > threshold:
        reasons.append(f"probe changed {change:.0%} > {threshold:.0%}")
    return "; ".join(reasons)


def noise_columns(times_ms: list[float] | np.ndarray, probe_ms: list[float],
                  threshold: float) -> dict[str, Any]:
    """The noise columns of an ``ok`` row: ``time_spread``, ``probe_ms`` and ``noisy``."""
    spread = relative_spread(times_ms)
    flagged = bool(why_noisy(spread, probe_change(probe_ms), threshold))
    return {"time_spread": spread, "probe_ms": json.dumps([float(f"{p:.6g}") for p in probe_ms]),
            "noisy": flagged}


def _parsed(text: Any) -> list[float]:
    """A JSON list cell (``times_ms``, ``probe_ms``) as floats (``[]`` when blank or bad)."""
    if not isinstance(text, str) or not text:
        return []
    try:
        values = json.loads(text)
    except ValueError:
        return []
    return [float(v) for v in values] if isinstance(values, list) else []


def _cell(row: Any, name: str) -> Any:
    """Column ``name`` of a row: a results-file mapping or a DataFrame row (``None``: none)."""
    return row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)


def _number(value: Any) -> float:
    """A cell as a finite float, else NaN."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def row_verdict(row: Any) -> str:
    """Why an ``ok`` row (a results-file mapping, or a DataFrame row of
    :func:`bench.speed.results.load_results`) is noisy, ``""`` when it is not: its spread
    and probe change against its own threshold (the default for rows written before the
    noise columns)."""
    threshold = _number(_cell(row, "noise_threshold"))
    if math.isnan(threshold):
        threshold = DEFAULT_THRESHOLD
    spread = _number(_cell(row, "time_spread"))
    if math.isnan(spread):
        spread = relative_spread(_parsed(_cell(row, "times_ms")))
    return why_noisy(spread, probe_change(_parsed(_cell(row, "probe_ms"))), threshold)


def is_noisy(row: Any) -> bool:
    """The ``noisy`` flag of a row: the recorded one, or for an ``ok`` row written before
    the flag, its :func:`row_verdict`; failure rows are never noisy."""
    if _cell(row, "status") != "ok":
        return False
    recorded = _cell(row, "noisy")
    if isinstance(recorded, (bool, np.bool_)) or recorded in ("True", "False"):
        return recorded in (True, "True")
    return bool(row_verdict(row))


def noisy_flags(df: Any) -> list[bool]:
    """:func:`is_noisy` of every row of a results DataFrame."""
    return [is_noisy(row) for row in df.itertuples()]
