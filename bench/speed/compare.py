"""Comparing two runs case by case, and the regression gate of ``attn-bench compare`` (docs/measurement.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attn.validation import require_number
from bench.engine.results import read_env

KEY = ["label", "kernel_requested", "seq_len", "batch", "heads", "kv_heads", "head_dim", "dtype",
       "device", "causal", "pass"]
#: the classes of :func:`classify_runs`, most alarming first
CLASSES = ("broken", "newly failing", "lost", "worse", "better", "fixed", "new", "unchanged")
#: classes that make the gate fail
FAILING = ("broken", "newly failing", "lost", "worse")
DEFAULT_ABS_MS = 1.0
#: relative threshold used to classify when no gate percentage is given
DEFAULT_REL_PCT = 5.0
_SIDE_COLUMNS = ["status", "time_ms", "time_iqr_ms", "kernel", "peak_mem_bytes", "problem"]
#: the merged columns of the two runs' sides, as a comparison names them
_RENAMED = {"time_ms_a": "time_a_ms", "time_ms_b": "time_b_ms", "time_iqr_ms_a": "iqr_a_ms",
            "time_iqr_ms_b": "iqr_b_ms", "peak_mem_bytes_a": "mem_a_bytes", "peak_mem_bytes_b": "mem_b_bytes"}


def machine_note(run_a: str | Path, run_b: str | Path) -> str | None:
    """A note when the runs come from different CPUs or devices (None: same, or not recorded)."""
    def machines(run: str | Path) -> set[tuple[str, str]]:
        return {(str(s.get("cpu_model") or s.get("device_name") or ""), str(s.get("cpu_capability") or ""))
                for s in read_env(run)}

    a, b = machines(run_a), machines(run_b)
    if not a or not b or a == b or ("", "") in a | b:
        return None
    said = "; ".join(" ".join(filter(None, m)) for m in sorted(a))
    other = "; ".join(" ".join(filter(None, m)) for m in sorted(b))
    return (f"note: the runs come from different machines (A: {said}; B: {other}): a change may be "
            "the machine, not the code (re-measure both on one machine to compare the code)")


def compare_runs(run_a: str | Path, run_b: str | Path) -> pd.DataFrame:
    """Matching ok rows with ``time_a_ms``, ``time_b_ms``, ``change_pct`` (+: B slower) and peak memory."""
    from bench.speed.results import load_results  # lazy: imports torch; the rule alone (history) needs none

    a = load_results(run_a)
    b = load_results(run_b)
    cols = [*KEY, "kernel", "time_ms", "peak_mem_bytes"]
    a = a[a.status == "ok"][cols].drop_duplicates(KEY)
    b = b[b.status == "ok"][cols].drop_duplicates(KEY)
    merged = a.merge(b, on=KEY, suffixes=("_a", "_b")).rename(columns=_RENAMED)
    merged["change_pct"] = (merged.time_b_ms / merged.time_a_ms - 1.0) * 100.0
    return merged.sort_values(["label", "kernel_requested", "pass", "seq_len"]).reset_index(drop=True)


def regressions(table: pd.DataFrame, max_pct: float) -> pd.DataFrame:
    """Rows of :func:`compare_runs` slower by more than ``max_pct`` percent (the relative test alone)."""
    return table[table.change_pct > max_pct]


def _one_row_per_key(df: pd.DataFrame) -> pd.DataFrame:
    """One row per key: the first sound ok row, else the first row (damaged last)."""
    order = (df.status != "ok").astype(int) + 2 * (df.problem != "").astype(int)
    df = df.assign(_order=order).sort_values("_order", kind="stable")
    return df.drop_duplicates(KEY)[[*KEY, *_SIDE_COLUMNS]]


def as_number(value: object) -> float:
    """``value`` as a float; missing values (None, NaN, pd.NA) become NaN."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return number


def noise_ms(iqr_a: float, iqr_b: float) -> float:
    """The noise of a pair of rows: half of A's IQR plus half of B's (missing IQR counts 0)."""
    return sum(0.0 if math.isnan(iqr) else iqr / 2.0 for iqr in (iqr_a, iqr_b))


def classify_case(status_a: str | None, status_b: str | None, time_a: float, time_b: float,
                  noise: float, rel_pct: float, abs_ms: float,
                  damaged: tuple[bool, bool] = (False, False)) -> str:
    """The class of one key; ``None`` status: not in that run; ``damaged``: rows that failed their schema."""
    for status, time, bad in zip((status_a, status_b), (time_a, time_b), damaged):
        if status is not None and (bad or (status == "ok" and not math.isfinite(time))):
            return "broken"
    if status_b is None:
        return "lost"
    if status_a is None:
        return "new"
    ok_a, ok_b = status_a == "ok", status_b == "ok"
    if ok_a != ok_b:
        return "newly failing" if ok_a else "fixed"
    if not ok_a:
        return "unchanged"
    margin = max(abs_ms, rel_pct / 100.0 * time_a, noise)
    diff = time_b - time_a
    if diff > margin:
        return "worse"
    if -diff > margin:
        return "better"
    return "unchanged"


def _status(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def classify_runs(run_a: str | Path, run_b: str | Path, rel_pct: float = DEFAULT_REL_PCT,
                  abs_ms: float = DEFAULT_ABS_MS) -> pd.DataFrame:
    """Every key of either run with ``class``, statuses, times, ``change_pct`` (+: B slower), ``noise_ms``."""
    require_number("rel_pct", rel_pct, minimum=0)
    require_number("abs_ms", abs_ms, minimum=0)
    from bench.speed.results import load_results  # lazy: as in compare_runs

    a = _one_row_per_key(load_results(run_a, damaged=True))
    b = _one_row_per_key(load_results(run_b, damaged=True))
    table = a.merge(b, on=KEY, how="outer", suffixes=("_a", "_b")).rename(columns=_RENAMED)
    classes, noises = [], []
    for row in table.itertuples(index=False):
        noise = noise_ms(as_number(row.iqr_a_ms), as_number(row.iqr_b_ms))
        noises.append(noise)
        damaged = (bool(_status(row.problem_a)), bool(_status(row.problem_b)))
        classes.append(classify_case(_status(row.status_a), _status(row.status_b),
                                     as_number(row.time_a_ms), as_number(row.time_b_ms), noise,
                                     rel_pct, abs_ms, damaged))
    table["class"] = pd.Series(classes, index=table.index, dtype=object)
    table["noise_ms"] = noises
    table["change_pct"] = (table.time_b_ms / table.time_a_ms - 1.0) * 100.0
    table["_rank"] = table["class"].map({name: i for i, name in enumerate(CLASSES)})
    table = table.sort_values(["_rank", "label", "kernel_requested", "pass", "seq_len"])
    return table.drop(columns="_rank").reset_index(drop=True)


def class_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many keys of a :func:`classify_runs` table fall in each class (every class listed)."""
    counts = table["class"].value_counts().to_dict()
    return {name: int(counts.get(name, 0)) for name in CLASSES}


def compared_count(table: pd.DataFrame) -> int:
    """Keys ok in both runs whose times were compared (not broken)."""
    return int(((table.status_a == "ok") & (table.status_b == "ok")
                & (table["class"] != "broken")).sum())


def gate_failures(table: pd.DataFrame) -> list[str]:
    """Why the regression gate fails (empty: passes): a :data:`FAILING` case, or none ok in both runs."""
    counts = class_counts(table)
    reasons = [f"{counts[name]} {name}" for name in FAILING if counts[name]]
    if compared_count(table) == 0:
        in_both = int((table.status_a.notna() & table.status_b.notna()).sum())
        reasons.append(f"no case is ok in both runs ({in_both} case(s) in both), so nothing "
                       "was compared")
    return reasons


def summary_line(table: pd.DataFrame) -> str:
    """``N cases: newly failing 5, lost 0, ...`` for a :func:`classify_runs` table."""
    counts = class_counts(table)
    return f"{len(table)} cases: " + ", ".join(f"{name} {n}" for name, n in counts.items())


def changed_cases(table: pd.DataFrame) -> pd.DataFrame:
    """The cases that are not ``unchanged``, with the key columns that tell them apart."""
    always = ["label", "kernel_requested", "pass", "seq_len"]
    varying = [c for c in KEY if c not in always and table[c].nunique(dropna=False) > 1]
    cols = ["class", *always, *varying, "status_a", "status_b", "time_a_ms", "time_b_ms",
            "change_pct", "noise_ms"]
    changed = table[table["class"] != "unchanged"]
    if (changed["class"] == "broken").any():
        problems = [a or b for a, b in zip(changed.problem_a.fillna(""), changed.problem_b.fillna(""))]
        changed = changed.assign(problem=[p or ("ok without a finite time" if c == "broken" else "")
                                          for p, c in zip(problems, changed["class"])])
        cols.append("problem")
    return changed[cols]
