"""The page of a training grid: per headline metric, the test value of every task and
variant (mean over seeds, their standard deviation as an error bar; one series per variant),
and every run's headline row in one table, failed runs marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from bench.html.page import figure_div, section, table_html
from bench.quality.report import load_quality
from bench.quality.tables import headline, task_order
from bench.quality.tasks import headline_titles

HOVER = ("<b>%{customdata[0]}</b><br>task %{customdata[1]}<br>%{customdata[2]}: %{y:.4g} "
         "± %{customdata[3]:.3g} (std over %{customdata[4]} seed(s))<br>kernel %{customdata[5]}<br>"
         "status %{customdata[6]}<extra></extra>")
TABLE_COLUMNS = ["task", "label", "role", "seed", "metric", "value", "status", "reason", "kernel", "steps",
                 "train_time_s", "peak_mem_mib", "commit"]
_FAILED = ("ok", "unsupported")


def scale(metric: str) -> float:
    """What a metric is shown times: accuracy in %, the others as recorded."""
    return 100.0 if metric == "accuracy" else 1.0


def kernels(paths: pd.Series) -> pd.Series:
    """The kernel of each row's ``kernel_path`` (``sdpa: sdpa(...)`` -> ``sdpa``; ``-``: none)."""
    return paths.astype(str).str.split(":").str[0].str.strip().replace("", "-")


def _figure(top: pd.DataFrame, metric: str, tasks: list[str]) -> go.Figure:
    """One series per label: the mean of ``metric`` per task, std over seeds as error bars."""
    fig = go.Figure()
    title = headline_titles().get(metric, metric)
    factor = scale(metric)
    for label, rows in top.groupby("label", sort=True):
        stats = rows.groupby("task").agg(mean=("value", "mean"), std=("value", "std"), n=("value", "size"),
                                         kernel=("kernel", "first"))
        stats = stats.reindex([t for t in tasks if t in stats.index])  # (tasks,)
        custom = [(label, task, title, (s["std"] if s.n > 1 else 0.0) * factor, int(s.n), s.kernel, "ok")
                  for task, s in stats.iterrows()]
        fig.add_trace(go.Scatter(
            x=stats.index.tolist(), y=(stats["mean"] * factor).tolist(), mode="markers", name=label,
            customdata=custom, hovertemplate=HOVER, marker=dict(size=10),
            error_y=dict(type="data", array=(stats["std"].fillna(0) * factor).tolist(), visible=True)))
    fig.update_layout(title=f"Test {title} per task and variant", xaxis_title="task",
                      yaxis_title=title + (" (%)" if factor == 100 else ""), height=480,
                      template="plotly_white", legend=dict(font=dict(size=10)))
    return fig


def quality_sections(run_dir: str | Path) -> tuple[list[str], list[str]]:
    """The page's sections of a training grid, and the commits of its rows."""
    df = load_quality(run_dir)
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: quality.csv has no rows yet; run or resume the grid")
    df = df.assign(kernel=kernels(df.kernel_path))
    top = headline(df)
    tasks = task_order(df)
    figures = [figure_div(_figure(top[top.metric == metric], metric, tasks), f"metric-{metric}")
               for metric in sorted(top.metric.unique())]
    sections = [section("Test results per task and variant", *figures,
                        note="Hover a point for its cell; click a legend entry to hide or show "
                             "a variant. Error bars: the standard deviation over seeds (none "
                             "with one seed). report.md has the tables and their intervals.")]
    failed = df[~df.status.isin(_FAILED)].drop_duplicates("unit_id")
    unsupported = df[df.status == "unsupported"].drop_duplicates("unit_id")
    rows = pd.concat([top, failed, unsupported], ignore_index=True)
    rows = rows.assign(value=[v * scale(m) if pd.notna(v) else v for v, m in zip(rows.value, rows.metric)],
                       peak_mem_mib=rows.peak_mem_bytes / 2**20, commit=rows.git_sha.astype(str).str.slice(0, 9),
                       reason=rows.reason.str.slice(0, 160))
    rows = rows.sort_values(["task", "label", "seed"], key=lambda c: c.astype(str))
    marks = ["failed" if status not in _FAILED else "" for status in rows.status]
    sections.append(section(
        "Every run (headline test row; failed and unsupported runs)",
        table_html(rows[TABLE_COLUMNS], "rows", marks=marks,
                   filters={"variant": "label", "kernel": "kernel", "task": "task"}),
        note="Click a header to sort by it; the selects show one variant, kernel or task. "
             "Accuracy in %. failed: the run did not finish (its status and reason)."))
    return sections, df.git_sha.dropna().astype(str).tolist()
