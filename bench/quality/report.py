"""The quality report of a training grid (``report.md``): the tables of :mod:`bench.quality.tables` explained."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.engine.fsutil import atomic_write_text
from bench.engine.markdown import markdown_table
from bench.engine.results import read_rows
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.quality.budget import budget_table, split_budget
from bench.quality.grid import QUALITY_FILE
from bench.quality.margins import SD_MARGIN, margins, strongest_references, unlearned_tasks
from bench.quality.model_parts import label
from bench.quality.reference import list_references
from bench.quality.state_table import state_section
from bench.quality.tables import (
    condition_table,
    cost_table,
    display_name,
    headline,
    margin_table,
    parameter_table,
    quality_table,
    signed_margin,
    significance_table,
)
from bench.quality.tasks import condition_views, headline_titles

REPORT_FILE = "report.md"
NUMERIC = ("value", "seed", "steps", "best_step", "train_time_s", "train_tokens_per_s",
           "eval_tokens_per_s", "peak_mem_bytes", "param_count", "seq_len", "state_bytes")


def load_quality(run_dir: str | Path) -> pd.DataFrame:
    """``quality.csv`` as a typed DataFrame."""
    run_dir = Path(run_dir)
    if not (run_dir / QUALITY_FILE).exists():
        raise FileNotFoundError(f"no {QUALITY_FILE} in {run_dir}")
    df = pd.DataFrame(read_rows(run_dir, QUALITY_FILE, QUALITY_COLUMNS), columns=QUALITY_COLUMNS)
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("condition", "reason", "kernel_path", "attention_parts", "title", "overrides", "state_rule"):
        df[col] = df[col].astype(object).fillna("").astype(str)
    df["role"] = df.role.astype(object).fillna("").replace("", "variant")  # before control rows
    if len(df):
        df["label"] = _labels(df)
    return df


def _labels(df: pd.DataFrame) -> pd.Series:
    """Every row's label by the current labelling, so rows written under an older one group with new ones."""
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
    df, budget = split_budget(load_quality(run_dir))
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: {QUALITY_FILE} has no rows yet; run or resume the grid")
    top = headline(df)
    strongest = strongest_references(top)
    found = margins(top, strongest)
    unlearned = unlearned_tasks(top, found=found)
    learned = ~df.task.isin(list(unlearned))
    table = quality_table(df[learned], top[~top.task.isin(list(unlearned))])
    titles = headline_titles()
    metrics = ", ".join(f"{t}: {titles.get(m, m)}" for t, m in
                        top.groupby("task").metric.first().items())
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
                df[~learned], top[top.task.isin(list(unlearned))]),
            "Out of the table above: on these tasks full attention is not past the strongest "
            "reference without attention by two seed standard deviations ("
            + "; ".join(f"{t}: {display_name(df, m.reference)}, margin {signed_margin(m)}"
                        for t, m in unlearned.items())
            + "), so a ranking of patterns read off them is not a finding about attention. "
            "Their figures stay here, beside the same floors.")
    parts += _section(
        "Past what needs no attention", margin_table(df, top, strongest=strongest, found=found),
        "Per task, the strongest reference row (the best mean among the rows with role "
        "reference) and each variant's mean past it (accuracy in points; bits per byte: "
        f"positive is fewer bits). ✓: past it by at least {SD_MARGIN:g} standard deviations of "
        "the variant's seeds, the bar for reading the task's ranking as a finding about "
        "attention; ~: past it by less; ✗: not past it (the model has not learned more than "
        "counting, compressing or recurrence gives); ?: past it, one seed.")
    parts += _section(
        "Parameters per model", parameter_table(df, top),
        "Every variant's model has the same sizes; a variant whose attention carries "
        "parameters of its own (a learned relative bias table) or a reference with another "
        "layer (a recurrent one) differs from full attention's model by the number in "
        "parentheses.")
    differences = significance_table(df, top)
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
    parts += ["## Cost per run (medians over seeds)", "", markdown_table(cost_table(df, top)), ""]
    for task, view in condition_views():
        found = condition_table(df, task, view.metric, view.prefix, numeric=view.numeric)
        if len(found):
            parts += [f"## {view.title}", "", markdown_table(found), ""]
    parts += state_section(top)
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
    budget_top = headline(budget)
    parts += [budget_table(budget_top)] if len(budget_top) else []
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
