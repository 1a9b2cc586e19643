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
default :data:`DEFAULT_THRESHOLD`), or when the machine was in a slow state for the whole
case: its probe (the lower of its readings) above :data:`SLOW_STATE_FACTOR` times the run's
quiet probe, the lowest probe of the run's ``ok`` rows measured in the same
:data:`PROBE_SCOPE` (same machine, device, thread count and torch); rows of another machine
or thread count are never compared. A case run while another job held the machine's cores
kept a probe of 8.0 ms before and after its rounds (no change, spreads under 2%) where the
run's other rows read 0.12-0.2 ms.

The slow state is a verdict about the run, not the row alone: the sweep's driver flags a new
row against the rows recorded before it (:func:`slow_state_marker`), and reading a run
(:func:`noisy_flags`, :func:`noisy_in`) judges every row against the quiet probe of the
whole run, so a row measured before the run's quiet ones, or written before the slow-state
check existed, is flagged too.

Fits and crossovers (:mod:`bench.speed.scaling`) leave noisy rows out; the report says so at
its top; ``attn-bench sweep --retry-noisy`` measures them again. Rows written before the
flag existed are judged by their repeats' spread under the default threshold (they have no
probe).
"""

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
#: a row whose probe (the lower of its readings) takes more than this many times the run's
#: quiet probe was measured in a slow state. Quiet rows stay well under it: in the 13
#: committed runs with a probe (555 ok rows, CPU and GPU), a row's probe was at most 2.5x
#: its run's quiet probe (99% of them under 2.4x: the median of 7 calls of a sub-millisecond
#: matmul still moves with the clock and the caches), while the slow states seen were 40x
#: (8.0 ms against 0.12-0.2 ms), 80x (16 ms against 0.2 ms, ``results/video-speed-cpu``) and
#: 270x (100 ms against 0.37 ms, ``results/packed-cpu``)
SLOW_STATE_FACTOR = 3.0
#: the columns whose values must match for two rows' probes to be compared: the machine,
#: its device, the worker's thread count and the torch that ran the matmul. Not the commit
#: (the probe is torch's matmul, whatever the suite's code) nor the run segment (a resume
#: run wholly in a slow state is one to catch).
PROBE_SCOPE = ("hostname", "device", "device_name", "threads", "torch_version")


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


def probe_level(probe_ms: list[float]) -> float:
    """What a row's probe says of the machine's state during the whole case: the lower of
    its readings (NaN without a positive one). A probe slow at one end only is a change
    (:func:`probe_change`); slow at both, a slow state."""
    values = [float(p) for p in probe_ms if p is not None and math.isfinite(p) and p > 0]
    return min(values) if values else math.nan


def probe_scope(row: Any) -> tuple[str, ...]:
    """The :data:`PROBE_SCOPE` of a row (a results-file mapping or a DataFrame row): the
    rows whose probes it is compared with share it (a blank cell is ``""``)."""
    def text(name: str) -> str:
        value = _cell(row, name)
        if name == "threads":
            number = _number(value)
            return "" if math.isnan(number) else f"{number:g}"
        return value if isinstance(value, str) else ""
    return tuple(text(name) for name in PROBE_SCOPE)


def _level(row: Any) -> float:
    """:func:`probe_level` of an ``ok`` row (NaN for any other)."""
    if _cell(row, "status") != "ok":
        return math.nan
    return probe_level(_parsed(_cell(row, "probe_ms")))


def quiet_probes(rows: Iterable[Any]) -> dict[tuple[str, ...], float]:
    """The run's quiet probe in each :func:`probe_scope`: the lowest :func:`probe_level` of
    its ``ok`` rows (a probe is never faster than the machine can run it, so the lowest is
    the quiet machine)."""
    quiet: dict[tuple[str, ...], float] = {}
    for row in rows:
        level = _level(row)
        if not math.isnan(level):
            scope = probe_scope(row)
            quiet[scope] = min(level, quiet.get(scope, math.inf))
    return quiet


def why_slow(level: float, quiet: float, factor: float = SLOW_STATE_FACTOR) -> str:
    """Why a row whose probe level is ``level`` ms was measured in a slow state, against the
    run's quiet probe ``quiet`` ms (``""``: it was not, or either is unknown)."""
    if not (math.isfinite(level) and math.isfinite(quiet) and quiet > 0 and level > factor * quiet):
        return ""
    return (f"slow state: probe {level:.3g} ms against the run's quiet {quiet:.3g} ms "
            f"({level / quiet:.0f}x > {factor:g}x)")


def slow_verdict(row: Any, quiet: Mapping[tuple[str, ...], float] | None) -> str:
    """:func:`why_slow` of an ``ok`` row against the quiet probes of its run
    (:func:`quiet_probes`; ``None``: not judged)."""
    if not quiet:
        return ""
    return why_slow(_level(row), quiet.get(probe_scope(row), math.nan))


def row_verdict(row: Any, quiet: Mapping[tuple[str, ...], float] | None = None) -> str:
    """Why an ``ok`` row (a results-file mapping, or a DataFrame row of
    :func:`bench.speed.results.load_results`) is noisy, ``""`` when it is not: its spread
    and probe change against its own threshold (the default for rows written before the
    noise columns) and, given its run's ``quiet`` probes (:func:`quiet_probes`), a slow
    state."""
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
    """The ``noisy`` flag of a row: the recorded one, or for an ``ok`` row written before
    the flag, its :func:`row_verdict`; given its run's ``quiet`` probes, also a row
    measured in a slow state (:func:`slow_verdict`). Failure rows are never noisy."""
    if _cell(row, "status") != "ok":
        return False
    recorded = _cell(row, "noisy")
    if isinstance(recorded, (bool, np.bool_)) or recorded in ("True", "False"):
        return recorded in (True, "True") or bool(slow_verdict(row, quiet))
    return bool(row_verdict(row, quiet))


def noisy_flags(df: Any) -> list[bool]:
    """:func:`is_noisy` of every row of a results DataFrame, against the quiet probes of
    all its rows."""
    quiet = quiet_probes(df.itertuples())
    return [is_noisy(row, quiet) for row in df.itertuples()]


def noisy_in(run_dir: str | Path) -> Callable[[Mapping[str, Any]], bool]:
    """What ``--retry-noisy`` measures again in ``run_dir``: :func:`is_noisy` of a row
    against the quiet probes of the run's ``results.csv``, read when the first row is asked
    about (inside the run's lock when the run asks)."""
    quiet: dict[tuple[str, ...], float] | None = None

    def noisy(row: Mapping[str, Any]) -> bool:
        nonlocal quiet
        if quiet is None:
            quiet = quiet_probes(read_table(run_dir).rows)
        return is_noisy(row, quiet)
    return noisy


def slow_state_marker(run_dir: str | Path) -> Callable[[dict[str, Any]], None]:
    """A function that flags each new ``ok`` row it is given ``noisy`` when its probe is
    slow against the quiet probe of the rows already in ``run_dir``'s ``results.csv`` and
    of the rows it was given before (the sweep's driver calls it on every row it records)."""
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
