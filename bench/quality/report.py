"""The quality report of a training grid: the LRA-style table (mean +- std over seeds, one
column per task, an average over the accuracy tasks) with its floors (uniform chance, the
majority class, and the grid's control rows), every variant's paired difference from full
attention against seed noise, cost per run, recall by distance, bits per byte by evaluation
length, greedy against beam BLEU, and provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.engine.fsutil import atomic_write_text
from bench.engine.results import read_rows
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.quality.budget import budget_table, split_budget
from bench.quality.grid import QUALITY_FILE
from bench.quality.margins import SD_MARGIN, Margin, margins, strongest_references, unlearned_tasks
from bench.quality.model_parts import label
from bench.quality.reference import list_references, reference_names
from bench.quality.significance import BETTER, LOWER_IS_BETTER, WORSE, differences_from_reference
from bench.quality.tasks import ClassificationTask, get_task, list_tasks
from bench.speed.report import markdown_table

REPORT_FILE = "report.md"
#: the headline metric of each task (test split, no condition) and its unit
HEADLINE = {"bits_per_byte": "bits/byte (lower is better)", "bleu": "BLEU", "accuracy": "accuracy"}
assert LOWER_IS_BETTER <= set(HEADLINE)
#: marks of a cell whose paired difference from full attention is beyond seed noise
MARKS = {BETTER: " ▲", WORSE: " ▼"}
UNIFORM, MAJORITY = "uniform chance (1 / classes)", "majority class (of the training labels)"
NUMERIC = ("value", "seed", "steps", "best_step", "train_time_s", "train_tokens_per_s",
           "eval_tokens_per_s", "peak_mem_bytes", "param_count", "seq_len")


def load_quality(run_dir: str | Path) -> pd.DataFrame:
    """``quality.csv`` as a typed DataFrame."""
    run_dir = Path(run_dir)
    if not (run_dir / QUALITY_FILE).exists():
        raise FileNotFoundError(f"no {QUALITY_FILE} in {run_dir}")
    df = pd.DataFrame(read_rows(run_dir, QUALITY_FILE, QUALITY_COLUMNS), columns=QUALITY_COLUMNS)
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # (a column an older file lacks is all missing: text, not float)
    for col in ("condition", "reason", "kernel_path", "attention_parts", "title", "overrides"):
        df[col] = df[col].astype(object).fillna("").astype(str)
    df["role"] = df.role.astype(object).fillna("").replace("", "variant")  # before control rows
    if len(df):
        df["label"] = _labels(df)
    return df


def _labels(df: pd.DataFrame) -> pd.Series:
    """Every row's label by the current labelling (:func:`bench.engine.labels.variant_label`), so
    rows written under an older one group with new ones; a row whose parameters do not
    parse keeps its own."""
    cache: dict[tuple[str, str, str], str] = {}

    titles = {r.name: r.title for r in list_references()}

    def one(row: pd.Series) -> str:
        if row.variant in titles:
            return titles[row.variant]  # a reference's title (its chosen setting is no name)
        key = (row.variant, row.params or "{}", row.overrides or "{}")
        if key not in cache:
            try:
                cache[key] = label(row.variant, json.loads(key[1]), json.loads(key[2]))
            except (ValueError, TypeError, AttributeError):
                cache[key] = row.label
        return cache[key]

    return df.apply(one, axis=1).astype(str)


def task_order(df: pd.DataFrame) -> list[str]:
    """Tasks in the suite's order (LRA first), then any others."""
    present = set(df.task)
    return [t for t in list_tasks() if t in present] + sorted(present - set(list_tasks()))


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """Test rows of each task's headline metric (no condition)."""
    test = df[(df.split == "test") & (df.condition == "") & (df.status == "ok")]
    return test[test.metric.isin(list(HEADLINE))]


def _cell(values: pd.Series, scale: float) -> str:
    values = values.dropna() * scale
    if values.empty:
        return "-"
    if len(values) == 1:
        return f"{values.iloc[0]:.1f}" if scale == 100 else f"{values.iloc[0]:.3f}"
    digits = 1 if scale == 100 else 3
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def _display(df: pd.DataFrame, name: str) -> str:
    """A label as the table shows it: a control with its title, ``full [position=none]
    (control: order-blind)``."""
    rows = df[df.label == name]
    if rows.empty or rows.role.iloc[0] == "variant":
        return name
    role = rows.role.iloc[0]
    computed = rows.variant.isin(reference_names()).any()  # its label is its title already
    title = "" if computed else next((t for t in rows.title if t and t != name), "")
    return f"{name} ({role}{': ' + title if title else ''})"


def _table_row(df: pd.DataFrame, top: pd.DataFrame, name: str, tasks: list[str],
               verdicts: dict[tuple[str, str], str], accuracy_tasks: int) -> dict[str, str]:
    """One row of the quality table; the average only over a row that has every accuracy task
    of the table (an average over fewer tasks would not compare with the others')."""
    row = {"variant": _display(df, name)}
    accuracies = []
    for task in tasks:
        part = top[(top.label == name) & (top.task == task)]
        unsupported = df[(df.label == name) & (df.task == task) & (df.status == "unsupported")]
        failed = df[(df.label == name) & (df.task == task) & ~df.status.isin(["ok", "unsupported"])]
        metric = part.metric.iloc[0] if len(part) else ""
        scale = 100 if metric == "accuracy" else 1
        row[task] = _cell(part.value, scale) + MARKS.get(verdicts.get((task, name), ""), "")
        if part.empty and _one_decoder_model(df, name, task):
            row[task] = "= full (one model in a decoder)"
        elif len(unsupported) and part.empty:
            row[task] = "unsupported"
        elif len(failed) and part.empty:
            row[task] = f"failed ({failed.status.iloc[0]})"
        if metric == "accuracy" and len(part):
            accuracies.append(part.value.mean() * 100)
    if set(df[df.label == name].variant) & set(reference_names()):
        accuracies = []  # a computed reference runs where it applies: no average to compare
    complete = accuracies and len(accuracies) == accuracy_tasks
    row["avg (accuracy tasks)"] = (f"{sum(accuracies) / len(accuracies):.1f}" if complete else
                                   f"- ({len(accuracies)} of {accuracy_tasks} tasks)" if accuracies
                                   else "-")
    return row


def _one_decoder_model(df: pd.DataFrame, name: str, task: str) -> bool:
    """``causal`` on a decoder-only task: the same model as ``full``, trained once (the grid
    does not train it twice: bench/quality/grid.py ``same_model_as_full``)."""
    kinds = set(df[df.task == task].model_kind.dropna())
    return name == "causal" and kinds == {"decoder_lm"} and (df[df.task == task].label == "full").any()


def quality_table(df: pd.DataFrame) -> pd.DataFrame:
    """Variants x tasks: mean +- std over seeds (accuracy in %), the average accuracy, a mark
    on each cell beyond seed noise from full attention (▲ better, ▼ worse); then, below a
    separator row, the floors: the control rows, the references without attention (trained
    ones first, then in bench/quality/reference's order), uniform chance and the majority
    class."""
    top, tasks = headline(df), task_order(df)
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
    return df[~df.variant.isin(reference_names())]


def uniform_chance(df: pd.DataFrame) -> dict[str, float]:
    """1 / number of classes of each classification task, from its data settings (the task
    is built, its data not loaded)."""
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
    """The test accuracy of always answering the training set's most frequent label."""
    rows = df[(df.split == "test") & (df.metric == "majority_accuracy") & (df.status == "ok")]
    return rows.groupby("task").value.first().to_dict()


def floor_row(df: pd.DataFrame, name: str, levels: dict[str, float]) -> dict[str, str]:
    """A floor as a table row (in %; ``-`` where a task has none)."""
    row = {"variant": name}
    for task in task_order(df):
        row[task] = f"{levels[task] * 100:.1f}" if task in levels else "-"
    row["avg (accuracy tasks)"] = "-"
    return row


def significance_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and variant, the paired difference from full attention over shared seeds:
    means, the difference with its 95% t-interval (accuracy in points), and the verdict."""
    found = differences_from_reference(trained(headline(df)))
    order = {t: i for i, t in enumerate(task_order(df))}
    found = found.sort_values(["task", "label"], key=lambda s: s.map(order) if s.name == "task" else s)
    rows = []
    for r in found.itertuples():
        scale, digits = display_unit(r.metric)
        interval = "-" if r.low is None or pd.isna(r.low) else \
            f"[{r.low * scale:+.{digits}f}, {r.high * scale:+.{digits}f}]"
        rows.append({"task": r.task, "variant": _display(df, r.label), "seeds": r.n,
                     "full": f"{r.reference * scale:.{digits}f}",
                     "variant mean": f"{r.value * scale:.{digits}f}",
                     "difference": f"{r.mean * scale:+.{digits}f}", "95% interval": interval,
                     "verdict": r.verdict})
    return pd.DataFrame(rows, columns=["task", "variant", "seeds", "full", "variant mean",
                                       "difference", "95% interval", "verdict"])


#: how the margin table marks each verdict (bench/quality/margins.py)
MARGIN_MARKS = {"clears": "✓", "within 2 sd": "~", "below": "✗", "one seed": "?"}


def margin_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tasks x variants: each variant's mean past its task's strongest reference row (accuracy
    in points; bits per byte: positive is fewer bits), marked ✓ beyond two seed standard
    deviations, ~ past it by less, ✗ not past it, ? past it with one seed."""
    top = headline(df)
    strongest = strongest_references(top)
    found = margins(top)
    if strongest.empty:
        return pd.DataFrame()
    names = sorted({m.label for m in found})
    rows = []
    for best in strongest.itertuples():
        scale, digits = display_unit(best.metric)
        row = {"task": best.task, "strongest reference": _display(df, best.label),
               "its value": f"{best.value * scale:.{digits}f}"}
        for m in found:
            if m.task == best.task:
                row[m.label] = f"{_signed(m)} {MARGIN_MARKS[m.verdict]}"
        rows.append(row)
    order = {t: i for i, t in enumerate(task_order(df))}
    table = pd.DataFrame(rows, columns=["task", "strongest reference", "its value", *names])
    return table.sort_values("task", key=lambda s: s.map(order)).fillna("-")


def display_unit(metric: str) -> tuple[int, int]:
    """``(scale, decimals)`` a metric is shown in: accuracy in % to 0.1, others to 0.001."""
    return (100, 1) if metric == "accuracy" else (1, 3)


def _signed(m: Margin) -> str:
    """A margin in the tables' unit (accuracy in points)."""
    scale, digits = display_unit(m.metric)
    return f"{m.margin * scale:+.{digits}f}"


def parameter_table(df: pd.DataFrame) -> pd.DataFrame:
    """Trained models x tasks: parameter count, and how many more or fewer than full
    attention's model on the same task (a relative bias's tables, a recurrent layer)."""
    top = trained(headline(df))
    counts = top.groupby(["label", "task"]).param_count.median().unstack("task")
    tasks = [t for t in task_order(df) if t in counts.columns]
    rows = []
    for name in counts.index:
        row = {"model": _display(df, name)}
        for task in tasks:
            value, full = counts.at[name, task], counts[task].get("full")
            if pd.isna(value):
                row[task] = "-"
                continue
            extra = "" if full is None or pd.isna(full) or value == full else f" ({value - full:+,.0f})"
            row[task] = f"{value:,.0f}{extra}"
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", *tasks])


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and variant: training throughput, train time, peak memory, parameters."""
    top = trained(headline(df))
    grouped = top.groupby(["task", "label"], sort=False).agg(
        seeds=("seed", "nunique"), train_tokens_per_s=("train_tokens_per_s", "median"),
        train_time_s=("train_time_s", "median"), peak_mem_mib=("peak_mem_bytes", "median"),
        params=("param_count", "median"), seq_len=("seq_len", "first"),
        best_step=("best_step", "median"), steps=("steps", "first"))
    grouped["peak_mem_mib"] = grouped.peak_mem_mib / 2**20
    order = {t: i for i, t in enumerate(task_order(df))}
    return grouped.reset_index().sort_values(["task", "label"], key=lambda s: s.map(order)
                                             if s.name == "task" else s)


def condition_table(df: pd.DataFrame, task: str, metric: str, prefix: str) -> pd.DataFrame:
    """Mean test value per variant and condition (``distance=``, ``length=``, ``decoding=``)."""
    part = df[(df.task == task) & (df.split == "test") & (df.metric == metric)
              & df.condition.str.startswith(prefix) & (df.status == "ok")]
    if part.empty:
        return part
    part = part.assign(key=part.condition.str.slice(len(prefix)))
    table = part.pivot_table(index="label", columns="key", values="value", aggfunc="mean")
    if prefix != "decoding=":
        table = table[sorted(table.columns, key=lambda c: float(c))]
    table.columns = [f"{prefix}{c}" for c in table.columns]
    return table.reset_index()


def _provenance(df: pd.DataFrame) -> list[str]:
    cols = ["git_sha", "package_version", "device_name", "threads", "hostname", "torch_version"]
    data = df.assign(**{c: df[c].astype("string").fillna("") for c in cols})
    table = data.groupby(cols).agg(rows=("unit_id", "size"), first=("timestamp", "min"),
                                   last=("timestamp", "max")).reset_index()
    note = ["**Rows from more than one environment** (resumed with --allow-mixed):"] if len(table) > 1 else []
    return ["## Provenance", "", *note, "", markdown_table(table), ""]


def build_quality_report(run_dir: str | Path) -> str:
    """The quality report of ``run_dir`` as markdown (also written to ``report.md`` there)."""
    run_dir = Path(run_dir)
    df, budget = split_budget(load_quality(run_dir))  # matched-compute rows apart: budget.py
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: {QUALITY_FILE} has no rows yet; run or resume the grid")
    unlearned = unlearned_tasks(headline(df))
    table = quality_table(df[~df.task.isin(list(unlearned))])
    metrics = ", ".join(f"{t}: {HEADLINE.get(m, m)}" for t, m in
                        headline(df).groupby("task").metric.first().items())
    counts = df.drop_duplicates("unit_id").groupby("status").size().to_dict()
    parts = [f"# Quality report: {run_dir.name}", "",
             "Runs by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             "## Test results (mean ± std over seeds; accuracy in %)", "",
             f"Headline metric per task: {metrics}. Each cell is the best-validation checkpoint "
             "evaluated once on the test split. The average is over the accuracy tasks. ▲ / ▼: "
             "better / worse than full attention beyond seed noise (the paired 95% interval "
             "below excludes 0). Below the variants, the floors: control rows (role: control "
             "in the grid, e.g. a model without position information), the references "
             "without attention (role: reference; docs/quality.md says what each computes), "
             "uniform chance (1 / number of classes) and the majority class (always "
             "answering the training set's most frequent label; below uniform chance when "
             "that label is rarer in the test split).", "",
             markdown_table(table) if len(table.columns) > 2 else
             "(No task: full attention is past its strongest reference without attention on "
             "none of them; see the next table.)", ""]
    if unlearned:
        parts += _section(
            "Tasks full attention has not learned at this budget", quality_table(
                df[df.task.isin(list(unlearned))]),
            "Out of the table above: on these tasks full attention is not past the strongest "
            "reference without attention by two seed standard deviations ("
            + "; ".join(f"{t}: {_display(df, m.reference)}, margin {_signed(m)}"
                        for t, m in unlearned.items())
            + "), so a ranking of patterns read off them is not a finding about attention. "
            "Their figures stay here, beside the same floors.")
    parts += _section(
        "Past what needs no attention", margin_table(df),
        "Per task, the strongest reference row (the best mean among the rows with role "
        "reference) and each variant's mean past it (accuracy in points; bits per byte: "
        f"positive is fewer bits). ✓: past it by at least {SD_MARGIN:g} standard deviations of "
        "the variant's seeds, the bar for reading the task's ranking as a finding about "
        "attention; ~: past it by less; ✗: not past it (the model has not learned more than "
        "counting, compressing or recurrence gives); ?: past it, one seed.")
    parts += _section(
        "Parameters per model", parameter_table(df),
        "Every variant's model has the same sizes; a variant whose attention carries "
        "parameters of its own (a learned relative bias table) or a reference with another "
        "layer (a recurrent one) differs from full attention's model by the number in "
        "parentheses.")
    differences = significance_table(df)
    if len(differences):
        parts += ["## Difference from full attention (paired by seed)", "",
                  "Seed s of a variant and of full attention drew the same data and initial "
                  "weights, so each seed gives one difference (variant - full; accuracy in "
                  "points). The interval is the 95% t-interval of the mean difference over the "
                  "shared seeds (n - 1 degrees of freedom); a verdict is `better` or `worse` "
                  "only when the interval excludes 0 (bits per byte: lower is better), `within "
                  "seed noise` when it contains 0, `n/a (one seed)` with a single shared seed. "
                  "Each test is at the 5% level on its own: among this many pairs a few "
                  "verdicts are expected by chance alone.", "",
                  markdown_table(differences), ""]
    parts += ["## Cost per run (medians over seeds)", "", markdown_table(cost_table(df)), ""]
    for title, task, metric, prefix in (
            ("Recall accuracy by distance (test)", "recall", "accuracy", "distance="),
            ("Bits per byte by evaluation length (test; trained at the first length)", "bytelm",
             "bits_per_byte", "length="),
            ("BLEU by decoding (test)", "translate", "bleu", "decoding=")):
        found = condition_table(df, task, metric, prefix)
        if len(found):
            parts += [f"## {title}", "", markdown_table(found), ""]
    unsupported = df[df.status == "unsupported"].drop_duplicates(["task", "label"])
    if len(unsupported):
        parts += ["## Unsupported (task, variant)", "",
                  markdown_table(unsupported[["task", "label", "reason"]]), ""]
    parts += ["## Which attention ran where", "",
              markdown_table(df[df.status == "ok"].drop_duplicates(["task", "label"])[
                  ["task", "label", "attention_parts", "kernel_path"]]), ""]
    failed = df[~df.status.isin(["ok", "unsupported"])]
    if len(failed):
        parts += ["## Runs that failed", "",
                  markdown_table(failed[["task", "label", "seed", "status", "reason"]]), ""]
    parts += [budget_table(headline(budget))] if len(headline(budget)) else []
    parts += _provenance(df)
    text = "\n".join(parts)
    atomic_write_text(run_dir / REPORT_FILE, text + "\n")
    return text


def _section(title: str, table: pd.DataFrame, intro: str) -> list[str]:
    """A report section (title, one paragraph, the table), or nothing for an empty table."""
    return [f"## {title}", "", intro, "", markdown_table(table), ""] if len(table) else []


def is_quality_run(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a training grid's results."""
    return (Path(run_dir) / QUALITY_FILE).exists()


