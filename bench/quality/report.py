"""The quality report of a training grid: the LRA-style table (mean +- std over seeds, one
column per task, an average over the accuracy tasks), chance levels, cost per run, recall by
distance, bits per byte by evaluation length, greedy against beam BLEU, and provenance."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.fsutil import atomic_write_text
from bench.quality.grid import QUALITY_COLUMNS, QUALITY_FILE
from bench.quality.tasks import list_tasks
from bench.report import markdown_table
from bench.results import read_rows

REPORT_FILE = "report.md"
#: the headline metric of each task (test split, no condition) and its unit
HEADLINE = {"bits_per_byte": "bits/byte (lower is better)", "bleu": "BLEU", "accuracy": "accuracy"}
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
    for col in ("condition", "reason", "kernel_path", "attention_parts"):
        df[col] = df[col].fillna("")
    return df


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


def quality_table(df: pd.DataFrame) -> pd.DataFrame:
    """Variants x tasks: mean +- std over seeds (accuracy in %), and the average accuracy."""
    top, tasks = headline(df), task_order(df)
    rows = []
    for variant_label in sorted(set(df.label)):
        row = {"variant": variant_label}
        accuracies = []
        for task in tasks:
            part = top[(top.label == variant_label) & (top.task == task)]
            unsupported = df[(df.label == variant_label) & (df.task == task)
                             & (df.status == "unsupported")]
            failed = df[(df.label == variant_label) & (df.task == task)
                        & ~df.status.isin(["ok", "unsupported"])]
            metric = part.metric.iloc[0] if len(part) else ""
            scale = 100 if metric == "accuracy" else 1
            row[task] = _cell(part.value, scale)
            if len(unsupported) and part.empty:
                row[task] = "unsupported"
            elif len(failed) and part.empty:
                row[task] = f"failed ({failed.status.iloc[0]})"
            if metric == "accuracy" and len(part):
                accuracies.append(part.value.mean() * 100)
        row["avg (accuracy tasks)"] = f"{sum(accuracies) / len(accuracies):.1f}" if accuracies else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def chance_row(df: pd.DataFrame) -> dict[str, str]:
    """The majority-class accuracy of each classification task's test split (in %)."""
    chance = df[(df.split == "test") & (df.metric == "majority_accuracy")]
    row = {"variant": "chance (majority class)"}
    for task in task_order(df):
        part = chance[chance.task == task]
        row[task] = f"{part.value.iloc[0] * 100:.1f}" if len(part) else "-"
    return row


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and variant: training throughput, train time, peak memory, parameters."""
    top = headline(df)
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
    df = load_quality(run_dir)
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: {QUALITY_FILE} has no rows yet; run or resume the grid")
    table = quality_table(df)
    table = pd.concat([table, pd.DataFrame([chance_row(df)])], ignore_index=True)
    metrics = ", ".join(f"{t}: {HEADLINE.get(m, m)}" for t, m in
                        headline(df).groupby("task").metric.first().items())
    counts = df.drop_duplicates("unit_id").groupby("status").size().to_dict()
    parts = [f"# Quality report: {run_dir.name}", "",
             "Runs by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             "## Test results (mean ± std over seeds; accuracy in %)", "",
             f"Headline metric per task: {metrics}. Each cell is the best-validation checkpoint "
             "evaluated once on the test split. The average is over the accuracy tasks.", "",
             markdown_table(table), ""]
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
    parts += _provenance(df)
    text = "\n".join(parts)
    atomic_write_text(run_dir / REPORT_FILE, text + "\n")
    return text


def is_quality_run(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a training grid's results."""
    return (Path(run_dir) / QUALITY_FILE).exists()


