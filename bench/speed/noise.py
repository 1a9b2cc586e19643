"""Whether a speed row was measured under contention, and the columns that say so (docs/measurement.md, "Noise")."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench.engine.results import read_table

#: the default noise policy: a row whose spread or probe change exceeds this is noisy
DEFAULT_THRESHOLD = 0.25
#: a probe level over this many times the run's quiet probe is a slow state (docs/measurement.md)
SLOW_STATE_FACTOR = 3.0
#: columns that must match for two rows' probes to be compared (not the commit: catch a slow resume)
PROBE_SCOPE = ("hostname", "device", "device_name", "threads", "torch_version", "probe_size")


def relative_spread(times_ms: list[float] | np.ndarray) -> float:
    """Interquartile range over median of ``times_ms`` (NaN without a positive median)."""
    times = np.asarray(times_ms, dtype=float)
    median = float(np.median(times)) if times.size else math.nan
    if not median > 0:
        return math.nan
    q25, q75 = np.percentile(times, [25, 75])
    return float(q75 - q25) / median


def probe_change(probe_ms: list[float]) -> float:
    """``max / min - 1`` of the probe readings (NaN without two positive ones)."""
    values = [float(p) for p in probe_ms if p is not None and math.isfinite(p) and p > 0]
    return max(values) / min(values) - 1.0 if len(values) >= 2 else math.nan


def why_noisy(spread: float, change: float, threshold: float) -> str:
    """Why a row with this spread and probe change is noisy (``""``: it is not)."""
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
    """A JSON list cell as floats (``[]`` when blank or bad)."""
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


def probe_level(probe_ms: list[float]) -> float:
    """The lower probe reading (NaN without one): slow at both ends is a slow state, at one a change."""
    values = [float(p) for p in probe_ms if p is not None and math.isfinite(p) and p > 0]
    return min(values) if values else math.nan


def probe_scope(row: Any) -> tuple[str, ...]:
    """The :data:`PROBE_SCOPE` values of a mapping or DataFrame row (blank: ``""``)."""
    def text(name: str) -> str:
        value = _cell(row, name)
        if name in ("threads", "probe_size"):
            number = _number(value)
            return "" if math.isnan(number) else f"{number:g}"
        return value if isinstance(value, str) else ""
    return tuple(text(name) for name in PROBE_SCOPE)


def _level(row: Any) -> float:
    """:func:`probe_level` of an ``ok`` row (NaN for any other)."""
    return probe_level(_parsed(_cell(row, "probe_ms"))) if _cell(row, "status") == "ok" else math.nan


def quiet_probes(rows: Iterable[Any]) -> dict[tuple[str, ...], float]:
    """The lowest :func:`probe_level` of the ``ok`` rows in each :func:`probe_scope`."""
    quiet: dict[tuple[str, ...], float] = {}
    for row in rows:
        level = _level(row)
        if not math.isnan(level):
            scope = probe_scope(row)
            quiet[scope] = min(level, quiet.get(scope, math.inf))
    return quiet


def why_slow(level: float, quiet: float, factor: float = SLOW_STATE_FACTOR) -> str:
    """Why probe level ``level`` ms is a slow state against ``quiet`` ms (``""``: not, or unknown)."""
    if not (math.isfinite(level) and math.isfinite(quiet) and quiet > 0 and level > factor * quiet):
        return ""
    return (f"slow state: probe {level:.3g} ms against the run's quiet {quiet:.3g} ms "
            f"({level / quiet:.0f}x > {factor:g}x)")


def slow_verdict(row: Any, quiet: Mapping[tuple[str, ...], float] | None) -> str:
    """:func:`why_slow` of an ``ok`` row against :func:`quiet_probes` (``None``: not judged)."""
    if not quiet:
        return ""
    return why_slow(_level(row), quiet.get(probe_scope(row), math.nan))


def row_verdict(row: Any, quiet: Mapping[tuple[str, ...], float] | None = None) -> str:
    """Why an ``ok`` row is noisy (``""``: not): spread and probe change over its threshold, a slow state."""
    threshold = _number(_cell(row, "noise_threshold"))
    if math.isnan(threshold):
        threshold = DEFAULT_THRESHOLD
    spread = _number(_cell(row, "time_spread"))
    if math.isnan(spread):
        spread = relative_spread(_parsed(_cell(row, "times_ms")))
    reasons = [why_noisy(spread, probe_change(_parsed(_cell(row, "probe_ms"))), threshold),
               slow_verdict(row, quiet)]
    return "; ".join(r for r in reasons if r)


def is_noisy(row: Any, quiet: Mapping[tuple[str, ...], float] | None = None) -> bool:
    """The recorded ``noisy`` flag (older rows: :func:`row_verdict`), or a slow state; failure rows never."""
    if _cell(row, "status") != "ok":
        return False
    recorded = _cell(row, "noisy")
    if isinstance(recorded, (bool, np.bool_)) or recorded in ("True", "False"):
        return recorded in (True, "True") or bool(slow_verdict(row, quiet))
    return bool(row_verdict(row, quiet))


def noisy_flags(df: Any) -> list[bool]:
    """:func:`is_noisy` of every row of a results DataFrame, against the quiet probes of all its rows."""
    quiet = quiet_probes(df.itertuples())
    return [is_noisy(row, quiet) for row in df.itertuples()]


def noisy_in(run_dir: str | Path) -> Callable[[Mapping[str, Any]], bool]:
    """``--retry-noisy``'s test: :func:`is_noisy` against the run's quiet probes, read at the first call (locked)."""
    quiet: dict[tuple[str, ...], float] | None = None

    def noisy(row: Mapping[str, Any]) -> bool:
        nonlocal quiet
        if quiet is None:
            quiet = quiet_probes(read_table(run_dir).rows)
        return is_noisy(row, quiet)
    return noisy


def slow_state_marker(run_dir: str | Path) -> Callable[[dict[str, Any]], None]:
    """The driver's marker: flags a new ``ok`` row ``noisy`` when slow against the rows recorded so far."""
    quiet = quiet_probes(read_table(run_dir).rows)

    def mark(row: dict[str, Any]) -> None:
        level = _level(row)
        if math.isnan(level):
            return
        scope = probe_scope(row)
        quiet[scope] = min(level, quiet.get(scope, math.inf))
        if why_slow(level, quiet[scope]):
            row["noisy"] = True
    return mark
