"""Is a variant's difference from full attention beyond seed noise? A 95% t-interval of the per-seed
differences (docs/quality.md, "Report and figures")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from bench.quality.tasks import lower_is_better

#: the variant every other one is compared with
REFERENCE = "full"
BETTER, WORSE, NOISE, ONE_SEED = "better", "worse", "within seed noise", "n/a (one seed)"

# two-sided 95% quantiles t(0.975, df) for df = 1..30 (any t table)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """``t(0.975, df)``: the table to 30, then the Cornish-Fisher expansion (Abramowitz and Stegun 26.7.5)."""
    if df < 1:
        raise ValueError(f"df: must be >= 1; got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True)
class Difference:
    """The paired difference (variant - reference) over ``n`` shared seeds."""

    n: int
    mean: float
    low: float | None  # the 95% interval; None with fewer than two seeds
    high: float | None
    verdict: str


def paired_difference(differences: Sequence[float], higher_is_better: bool = True) -> Difference:
    """Mean, 95% t-interval and verdict of per-seed differences ``variant - reference``."""
    values = [float(d) for d in differences]
    n = len(values)
    if n == 0:
        raise ValueError("differences: need at least one shared seed")
    mean = sum(values) / n
    if n < 2:
        return Difference(n, mean, None, None, ONE_SEED)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if low <= 0 <= high:
        verdict = NOISE
    else:
        verdict = BETTER if (mean > 0) == higher_is_better else WORSE
    return Difference(n, mean, low, high, verdict)


def differences_from_reference(top: pd.DataFrame) -> pd.DataFrame:
    """Per task and label of the headline test rows ``top``, the paired difference from ``full`` over the shared
    seeds (the reference and the variant as means over them); tasks without ``full`` are left out."""
    columns = ["task", "label", "metric", "n", "reference", "value", "mean", "low", "high",
               "verdict"]
    found = []
    for task, part in top.groupby("task", sort=False):
        by_seed = part.groupby(["label", "seed"]).value.mean()
        if REFERENCE not in by_seed.index.get_level_values(0):
            continue
        reference = by_seed.loc[REFERENCE]
        metric = part.metric.iloc[0]
        for name in sorted(set(part.label) - {REFERENCE}):
            values = by_seed.loc[name]
            shared = sorted(set(values.index) & set(reference.index))
            if not shared:
                continue
            diff = paired_difference([values[s] - reference[s] for s in shared],
                                     higher_is_better=not lower_is_better(metric))
            found.append({"task": task, "label": name, "metric": metric, "n": diff.n,
                          "reference": float(reference[shared].mean()),
                          "value": float(values[shared].mean()), "mean": diff.mean,
                          "low": diff.low, "high": diff.high, "verdict": diff.verdict})
    return pd.DataFrame(found, columns=columns)
