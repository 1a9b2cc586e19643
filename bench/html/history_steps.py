"""Steps between consecutive commits of one series (a figure of one case on one machine), each classed by the
rule of ``attn-bench compare`` (:func:`bench.speed.compare.classify_case`; docs/history.md)."""

from __future__ import annotations

import itertools
import math

import pandas as pd

from bench.speed.compare import DEFAULT_ABS_MS, DEFAULT_REL_PCT, FAILING, as_number, classify_case, noise_ms

#: the absolute threshold of a figure other than a time, in its own unit (memory: MiB)
ABSOLUTE = {"memory_mib": 1.0}
#: figures whose spread is none of the rule's business (a quality metric: 0 absolute)
_TIMES = ("time_ms", "step_ms", "tokens_per_s")
STEP_COLUMNS = ["figure", "case", "machine", "commit_a", "commit_b", "time_a", "time_b", "value_a", "value_b",
                "spread_a", "spread_b", "change_pct", "noise", "class", "run_a", "run_b"]


def worse_is_larger(figure: str, value: float, spread: float, lower_is_better: bool) -> tuple[float, float]:
    """``(value, spread)`` put so that larger is worse, as the rule reads a time (docs/history.md)."""
    if figure == "tokens_per_s":
        return (1000.0 / value if value > 0 else math.nan), math.nan
    return (value if lower_is_better else 100.0 - value), spread  # accuracy in %, BLEU: what is missing to 100


SERIES = ["figure", "case", "machine"]


def last_per_commit(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per commit of every series (its latest run's), each series in commit order."""
    ordered = rows.sort_values([*SERIES, "commit_time", "timestamp"], kind="stable")
    return ordered.drop_duplicates([*SERIES, "commit_sha"], keep="last").reset_index(drop=True)


def series_points(rows: pd.DataFrame) -> dict[tuple[str, str, str], list[dict]]:
    """``{(figure, case, machine): its points}``: :func:`last_per_commit` as plain records."""
    found: dict[tuple[str, str, str], list[dict]] = {}
    for record in last_per_commit(rows).to_dict("records"):
        found.setdefault((record["figure"], record["case"], record["machine"]), []).append(record)
    return found


def series_steps(rows: pd.DataFrame, rel_pct: float = DEFAULT_REL_PCT,
                 abs_ms: float = DEFAULT_ABS_MS) -> pd.DataFrame:
    """Every step of every series of ``rows`` (the history's rows) with its class."""
    steps = []
    for (figure, case, where), points in series_points(rows).items():
        absolute = abs_ms if figure in _TIMES else ABSOLUTE.get(figure, 0.0)
        for a, b in itertools.pairwise(points):
            lower = bool(b["lower_is_better"])
            value_a, spread_a = worse_is_larger(figure, as_number(a["value"]), as_number(a["spread"]), lower)
            value_b, spread_b = worse_is_larger(figure, as_number(b["value"]), as_number(b["spread"]), lower)
            noise = noise_ms(spread_a, spread_b)
            verdict = classify_case(a["status"], b["status"], value_a, value_b, noise, rel_pct, absolute)
            before = as_number(a["value"])
            change = (as_number(b["value"]) / before - 1.0) * 100.0 if before else math.nan
            steps.append({"figure": figure, "case": case, "machine": where, "commit_a": a["commit_sha"],
                          "commit_b": b["commit_sha"], "time_a": a["commit_time"], "time_b": b["commit_time"],
                          "value_a": a["value"], "value_b": b["value"], "spread_a": a["spread"],
                          "spread_b": b["spread"], "change_pct": change, "noise": noise, "class": verdict,
                          "run_a": a["run"], "run_b": b["run"]})
    return pd.DataFrame(steps, columns=STEP_COLUMNS)


def regressions(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps the gate fails on (``worse``, ``newly failing``, ``broken``)."""
    return steps[steps["class"].isin(FAILING)]


def newest_regressions(steps: pd.DataFrame) -> pd.DataFrame:
    """Of every series, its newest step when that step is a regression."""
    return regressions(steps.drop_duplicates(SERIES, keep="last"))
