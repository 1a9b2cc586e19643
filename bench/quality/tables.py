"""The tables of a grid's quality report, each from ``quality.csv`` as a DataFrame; a ``top`` argument is
:func:`headline` of ``df``, passed when the caller has it already."""

from __future__ import annotations

import json

import pandas as pd

from bench.quality.budget import seed_cell
from bench.quality.data.errors import DataMissingError
from bench.quality.margins import Margin, margins, strongest_references
from bench.quality.model_parts import always_causal
from bench.quality.reference import list_references
from bench.quality.reference_unit import reference_row_mask
from bench.quality.significance import BETTER, WORSE, differences_from_reference
from bench.quality.tasks import ClassificationTask, display_unit, get_task, headline_titles, order_tasks

#: marks of a cell whose paired difference from full attention is beyond seed noise
MARKS = {BETTER: " ▲", WORSE: " ▼"}
UNIFORM, MAJORITY = "uniform chance (1 / classes)", "majority class (of the training labels)"
#: what a ``causal`` cell of a decoder-only task trained as ``causal`` adds to its value
SAME_AS_FULL = "(= full: one model in a decoder)"


def task_order(df: pd.DataFrame) -> list[str]:
    """Tasks in the registered tasks' order (LRA first), then any others."""
    return order_tasks(df.task)


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """Test rows of each task's headline metric (no condition)."""
    test = df[(df.split == "test") & (df.condition == "") & (df.status == "ok")]
    return test[test.metric.isin(list(headline_titles()))]


def display_name(df: pd.DataFrame, name: str) -> str:
    """A label as the table shows it: ``full [position=none] (control: order-blind)``."""
    rows = df[df.label == name]
    if rows.empty or rows.role.iloc[0] == "variant":
        return name
    role = rows.role.iloc[0]
    computed = reference_row_mask(rows).any()  # its label is its title already
    title = "" if computed else next((t for t in rows.title if t and t != name), "")
    return f"{name} ({role}{': ' + title if title else ''})"


def _table_row(df: pd.DataFrame, top: pd.DataFrame, name: str, tasks: list[str],
               verdicts: dict[tuple[str, str], str], accuracy_tasks: int) -> dict[str, str]:
    """One row of the quality table; averaged only over a row with every accuracy task (else it would not compare)."""
    row = {"variant": display_name(df, name)}
    accuracies = []
    for task in tasks:
        part = top[(top.label == name) & (top.task == task)]
        unsupported = df[(df.label == name) & (df.task == task) & (df.status == "unsupported")]
        failed = df[(df.label == name) & (df.task == task) & ~df.status.isin(["ok", "unsupported"])]
        metric = part.metric.iloc[0] if len(part) else ""
        row[task] = seed_cell(part.value, metric) + MARKS.get(verdicts.get((task, name), ""), "")
        one_model = _one_decoder_model(df, name, task)
        if part.empty and one_model and (df[df.task == task].label == "full").any():
            row[task] = "= full (one model in a decoder)"
        elif len(part) and one_model:
            row[task] += f" {SAME_AS_FULL}"  # trained as causal: full was not in the selection
        elif len(unsupported) and part.empty:
            row[task] = "unsupported"
        elif len(failed) and part.empty:
            row[task] = f"failed ({failed.status.iloc[0]})"
        if metric == "accuracy" and len(part):
            accuracies.append(part.value.mean() * 100)
    if reference_row_mask(df[df.label == name]).any():
        accuracies = []  # a computed reference runs where it applies: no average to compare
    complete = accuracies and len(accuracies) == accuracy_tasks
    row["avg (accuracy tasks)"] = (f"{sum(accuracies) / len(accuracies):.1f}" if complete else
                                   f"- ({len(accuracies)} of {accuracy_tasks} tasks)" if accuracies
                                   else "-")
    return row


def _one_decoder_model(df: pd.DataFrame, name: str, task: str) -> bool:
    """``causal`` on a decoder-only task: the same model as ``full`` (units.py ``same_model_as_full``)."""
    kinds = set(df[df.task == task].model_kind.dropna())
    return name == "causal" and bool(kinds) and all(always_causal(k) for k in kinds)


def quality_table(df: pd.DataFrame, top: pd.DataFrame | None = None) -> pd.DataFrame:
    """Variants x tasks, mean ± std over seeds, marked ▲/▼ beyond seed noise; then the controls and floors."""
    top, tasks = headline(df) if top is None else top, task_order(df)
    found = differences_from_reference(trained(top))
    verdicts = {(r.task, r.label): r.verdict for r in found.itertuples()}
    roles = df.drop_duplicates("label").set_index("label").role
    variants = sorted(n for n in roles.index if roles[n] == "variant")
    controls = sorted(n for n in roles.index if roles[n] == "control")
    order = {r.title: i for i, r in enumerate(list_references())}
    references = sorted((n for n in roles.index if roles[n] == "reference"),
                        key=lambda n: (order.get(n, -1), n))
    controls += references
    accuracy_tasks = top[top.metric == "accuracy"].task.nunique()
    rows = [_table_row(df, top, name, tasks, verdicts, accuracy_tasks) for name in variants]
    separator = {"variant": "**floors and controls**",
                 **{c: "" for c in [*tasks, "avg (accuracy tasks)"]}}
    rows.append(separator)
    rows += [_table_row(df, top, name, tasks, verdicts, accuracy_tasks) for name in controls]
    rows += [floor_row(df, UNIFORM, uniform_chance(df)), floor_row(df, MAJORITY, majority_class(df))]
    return pd.DataFrame(rows)


def trained(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` less the rows of computed references (no seeds, nothing to pair)."""
    return df[~reference_row_mask(df)]


def uniform_chance(df: pd.DataFrame) -> dict[str, float]:
    """1 / number of classes of each classification task, from its data settings (no data loaded)."""
    found = {}
    for task, part in df[df.settings.fillna("") != ""].groupby("task", sort=False):
        try:
            data = json.loads(part.settings.iloc[0]).get("data", {})
            built = get_task(task, data, 0)
        except (ValueError, TypeError, KeyError):
            continue  # a task this version does not know, or settings it cannot read
        if isinstance(built, ClassificationTask) and built.num_classes > 0:
            found[task] = 1 / built.num_classes
    return found


def majority_class(df: pd.DataFrame) -> dict[str, float]:
    """Each task's majority-class test accuracy: as the trained rows recorded it, else from its data."""
    rows = df[(df.split == "test") & (df.metric == "majority_accuracy") & (df.status == "ok")]
    found = rows.groupby("task").value.first().to_dict()
    for task, part in df[df.settings.fillna("") != ""].groupby("task", sort=False):
        if task not in found:
            seed = part.seed.dropna()
            level = majority_from_data(task, part.settings.iloc[0],
                                       int(seed.iloc[0]) if len(seed) else 0)
            if level is not None:
                found[task] = level
    return found


def majority_from_data(task: str, settings: str, seed: int = 0) -> float | None:
    """The test accuracy of ``task``'s most frequent training label with a row's ``settings`` (JSON); ``None``
    without classes, readable settings or installed data."""
    try:
        built = get_task(task, json.loads(settings).get("data", {}), seed)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # a task this version does not know, or settings it cannot read
    if not isinstance(built, ClassificationTask) or built.num_classes <= 0:
        return None
    try:
        built.prepare()
    except (DataMissingError, ValueError, TypeError, KeyError):
        return None  # data not installed, or data settings short of a key: the floor stays "-"
    return built.majority_accuracy("test", built.num_examples("test")).value


def floor_row(df: pd.DataFrame, name: str, levels: dict[str, float]) -> dict[str, str]:
    """A floor as a table row (in %; ``-`` where a task has none)."""
    row = {"variant": name}
    for task in task_order(df):
        row[task] = f"{levels[task] * 100:.1f}" if task in levels else "-"
    row["avg (accuracy tasks)"] = "-"
    return row


def significance_table(df: pd.DataFrame, top: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task and variant, the paired difference from full attention, its 95% t-interval and verdict."""
    found = differences_from_reference(trained(headline(df) if top is None else top))
    order = {t: i for i, t in enumerate(task_order(df))}
    found = found.sort_values(["task", "label"], key=lambda s: s.map(order) if s.name == "task" else s)
    rows = []
    for r in found.itertuples():
        scale, digits = display_unit(r.metric)
        interval = "-" if r.low is None or pd.isna(r.low) else \
            f"[{r.low * scale:+.{digits}f}, {r.high * scale:+.{digits}f}]"
        rows.append({"task": r.task, "variant": display_name(df, r.label), "seeds": r.n,
                     "full": f"{r.reference * scale:.{digits}f}",
                     "variant mean": f"{r.value * scale:.{digits}f}",
                     "difference": f"{r.mean * scale:+.{digits}f}", "95% interval": interval,
                     "verdict": r.verdict})
    return pd.DataFrame(rows, columns=["task", "variant", "seeds", "full", "variant mean",
                                       "difference", "95% interval", "verdict"])


#: how the margin table marks each verdict (bench/quality/margins.py)
MARGIN_MARKS = {"clears": "✓", "within 2 sd": "~", "below": "✗", "one seed": "?"}


def margin_table(df: pd.DataFrame, top: pd.DataFrame | None = None, *,
                 strongest: pd.DataFrame | None = None,
                 found: list[Margin] | None = None) -> pd.DataFrame:
    """Tasks x variants: each variant's margin past its task's strongest reference, marked as :data:`MARGIN_MARKS`."""
    top = headline(df) if top is None else top
    strongest = strongest_references(top) if strongest is None else strongest
    found = margins(top, strongest) if found is None else found
    if strongest.empty:
        return pd.DataFrame()
    names = sorted({m.label for m in found})
    rows = []
    for best in strongest.itertuples():
        scale, digits = display_unit(best.metric)
        row = {"task": best.task, "strongest reference": display_name(df, best.label),
               "its value": f"{best.value * scale:.{digits}f}"}
        for m in found:
            if m.task == best.task:
                row[m.label] = f"{signed_margin(m)} {MARGIN_MARKS[m.verdict]}"
        rows.append(row)
    order = {t: i for i, t in enumerate(task_order(df))}
    table = pd.DataFrame(rows, columns=["task", "strongest reference", "its value", *names])
    return table.sort_values("task", key=lambda s: s.map(order)).fillna("-")


def signed_margin(m: Margin) -> str:
    """A margin in the tables' unit (accuracy in points)."""
    scale, digits = display_unit(m.metric)
    return f"{m.margin * scale:+.{digits}f}"


def parameter_table(df: pd.DataFrame, top: pd.DataFrame | None = None) -> pd.DataFrame:
    """Trained models x tasks: parameter count, and its difference from full attention's model."""
    top = trained(headline(df) if top is None else top)
    counts = top.groupby(["label", "task"]).param_count.median().unstack("task")
    tasks = [t for t in task_order(df) if t in counts.columns]
    rows = []
    for name in counts.index:
        row = {"model": display_name(df, name)}
        for task in tasks:
            value, full = counts.at[name, task], counts[task].get("full")
            if pd.isna(value):
                row[task] = "-"
                continue
            extra = "" if full is None or pd.isna(full) or value == full else f" ({value - full:+,.0f})"
            row[task] = f"{value:,.0f}{extra}"
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", *tasks])


def cost_table(df: pd.DataFrame, top: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task and variant: training throughput, train time, peak memory, parameters."""
    top = trained(headline(df) if top is None else top)
    grouped = top.groupby(["task", "label"], sort=False).agg(
        seeds=("seed", "nunique"), train_tokens_per_s=("train_tokens_per_s", "median"),
        train_time_s=("train_time_s", "median"), peak_mem_mib=("peak_mem_bytes", "median"),
        params=("param_count", "median"), seq_len=("seq_len", "first"),
        best_step=("best_step", "median"), steps=("steps", "first"))
    grouped["peak_mem_mib"] = grouped.peak_mem_mib / 2**20
    order = {t: i for i, t in enumerate(task_order(df))}
    return grouped.reset_index().sort_values(["task", "label"], key=lambda s: s.map(order)
                                             if s.name == "task" else s)


def condition_table(df: pd.DataFrame, task: str, metric: str, prefix: str, *,
                    numeric: bool = True) -> pd.DataFrame:
    """Mean test value per variant and condition (``prefix``, e.g. ``distance=``), sorted when ``numeric``."""
    part = df[(df.task == task) & (df.split == "test") & (df.metric == metric)
              & df.condition.str.startswith(prefix) & (df.status == "ok")]
    if part.empty:
        return part
    part = part.assign(key=part.condition.str.slice(len(prefix)))
    table = part.pivot_table(index="label", columns="key", values="value", aggfunc="mean")
    if numeric:
        table = table[sorted(table.columns, key=lambda c: float(c))]
    table.columns = [f"{prefix}{c}" for c in table.columns]
    return table.reset_index()
