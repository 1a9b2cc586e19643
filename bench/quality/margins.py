"""Does a variant beat what needs no attention? Each variant's mean over seeds against its task's strongest
``reference`` row (docs/quality.md, "References without attention")."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.quality.tasks import lower_is_better

CLEARS, SHORT, BELOW, ONE_SEED = "clears", "within 2 sd", "below", "one seed"
#: how many of the variant's seed standard deviations the margin must reach
SD_MARGIN = 2.0


@dataclass(frozen=True)
class Margin:
    """One variant on one task against the task's strongest reference."""

    task: str
    label: str
    metric: str
    reference: str
    reference_value: float
    mean: float
    sd: float | None  # over seeds; None with one seed
    n: int
    margin: float  # mean past the reference, in the metric's better direction
    verdict: str


def strongest_references(top: pd.DataFrame) -> pd.DataFrame:
    """Per task of the headline test rows ``top``, the reference with the best mean: ``task, label, metric, value``."""
    refs = top[top.role == "reference"]
    rows = []
    for task, part in refs.groupby("task", sort=False):
        means = part.groupby("label").value.mean()
        metric = part.metric.iloc[0]
        best = means.idxmin() if lower_is_better(metric) else means.idxmax()
        rows.append({"task": task, "label": best, "metric": metric, "value": float(means[best])})
    return pd.DataFrame(rows, columns=["task", "label", "metric", "value"])


def margins(top: pd.DataFrame, strongest: pd.DataFrame | None = None) -> list[Margin]:
    """Every variant (role ``variant``) on every task that has a reference row."""
    found = []
    strongest = (strongest_references(top) if strongest is None else strongest).set_index("task")
    for (task, name), part in top[top.role == "variant"].groupby(["task", "label"], sort=False):
        if task not in strongest.index:
            continue
        best = strongest.loc[task]
        values = part.groupby("seed").value.mean()
        n, mean = len(values), float(values.mean())
        sd = float(values.std(ddof=1)) if n > 1 else None
        sign = -1.0 if lower_is_better(best.metric) else 1.0
        margin = sign * (mean - best.value)
        if margin <= 0:
            verdict = BELOW
        elif sd is None:
            verdict = ONE_SEED
        else:
            verdict = CLEARS if margin >= SD_MARGIN * sd else SHORT
        found.append(Margin(task, name, best.metric, best.label, best.value, mean, sd, n, margin,
                            verdict))
    return found


def unlearned_tasks(top: pd.DataFrame, reference: str = "full", *,
                    found: list[Margin] | None = None) -> dict[str, Margin]:
    """Tasks where ``reference`` (full attention) is below the strongest reference row or past it by less than
    :data:`SD_MARGIN` seed standard deviations (one seed past it is not judged)."""
    return {m.task: m for m in (margins(top) if found is None else found)
            if m.label == reference and m.verdict in (BELOW, SHORT)}
