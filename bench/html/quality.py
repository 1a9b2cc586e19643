"""The page of a training grid: a panel per task and metric, the margin table, every run's headline row."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.html.page import figure_div, section, table_html
from bench.html.palette import GREY, series_styles
from bench.quality.margins import BELOW, CLEARS, margins
from bench.quality.report import load_quality
from bench.quality.tables import MAJORITY, UNIFORM, headline, task_order, uniform_chance
from bench.quality.tasks import headline_titles

HOVER = ("<b>%{customdata[0]}</b><br>task %{customdata[1]}<br>%{customdata[2]}: %{y:.4g} "
         "± %{customdata[3]:.3g} (std over %{customdata[4]} seed(s))<br>kernel %{customdata[5]}<br>"
         "status %{customdata[6]}<extra></extra>")
TABLE_COLUMNS = ["task", "label", "role", "seed", "metric", "value", "status", "reason", "kernel", "steps",
                 "train_time_s", "peak_mem_mib", "commit"]
_FAILED = ("ok", "unsupported")
PANEL_COLUMNS = 4
MARGIN_COLOURS = {CLEARS: "#c7e9c0", BELOW: "#fcbba1"}
MARGIN_OTHER = "#fff3c4"


def scale(metric: str) -> float:
    """Accuracy in %, the others as recorded."""
    return 100.0 if metric == "accuracy" else 1.0


def kernels(paths: pd.Series) -> pd.Series:
    """The kernel of each row's ``kernel_path`` (``sdpa: sdpa(...)`` -> ``sdpa``; ``-``: none)."""
    return paths.astype(str).str.split(":").str[0].str.strip().replace("", "-")


def floors(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``{task: {name: accuracy}}``: uniform chance and the majority class as the rows recorded it."""
    found: dict[str, dict[str, float]] = {}
    for task, level in uniform_chance(df).items():
        found.setdefault(task, {})[UNIFORM] = level
    rows = df[(df.split == "test") & (df.metric == "majority_accuracy") & (df.status == "ok")]
    for task, level in rows.groupby("task").value.first().items():
        found.setdefault(task, {})[MAJORITY] = float(level)
    return found


def _lines(top: pd.DataFrame, task: str, metric: str, levels: dict[str, dict[str, float]]) -> list[tuple[str, float]]:
    """One panel's grey lines: reference and control means, then floors for accuracy."""
    rows = top[(top.task == task) & top.role.isin(["reference", "control"])]
    lines = [(str(label), float(part.value.mean())) for label, part in rows.groupby("label", sort=True)]
    if metric == "accuracy":
        lines += sorted(levels.get(task, {}).items())
    return lines


def _figure(top: pd.DataFrame, metric: str, tasks: list[str], levels: dict[str, dict[str, float]]) -> go.Figure:
    title = headline_titles().get(metric, metric)
    factor = scale(metric)
    tasks = [t for t in tasks if t in set(top.task)]
    columns = min(PANEL_COLUMNS, len(tasks))
    panel_rows = math.ceil(len(tasks) / columns)
    fig = make_subplots(rows=panel_rows, cols=columns, subplot_titles=tasks, horizontal_spacing=0.06,
                        vertical_spacing=0.5 / panel_rows)
    variants = top[top.role == "variant"]
    labels = sorted(variants.label.unique())
    styles = dict(zip(labels, series_styles(len(labels))))
    shown: set[str] = set()
    for index, task in enumerate(tasks):
        row, col = index // columns + 1, index % columns + 1
        for label in labels:
            part = variants[(variants.task == task) & (variants.label == label)]
            if part.empty:
                continue
            seeds = part.groupby("seed").value.mean()
            std = float(seeds.std()) if len(seeds) > 1 else 0.0
            colour, symbol = styles[label]
            custom = [(label, task, title, std * factor, len(seeds), part.kernel.iloc[0], "ok")]
            fig.add_trace(go.Scatter(
                x=[label], y=[float(seeds.mean()) * factor], mode="markers", name=label, legendgroup=label,
                showlegend=label not in shown, customdata=custom, hovertemplate=HOVER,
                marker=dict(size=10, color=colour, symbol=symbol),
                error_y=dict(type="data", array=[std * factor], visible=True, color=colour)), row=row, col=col)
            shown.add(label)
        axis = "" if index == 0 else str(index + 1)
        for name, value in _lines(top, task, metric, levels):
            fig.add_shape(type="line", xref=f"x{axis} domain", yref=f"y{axis}", x0=0, x1=1,
                          y0=value * factor, y1=value * factor, line=dict(color=GREY, dash="dash", width=1))
            fig.add_annotation(xref=f"x{axis} domain", yref=f"y{axis}", x=1, y=value * factor, text=name,
                               showarrow=False, xanchor="right", yanchor="bottom",
                               font=dict(size=9, color=GREY))
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=f"Test {title} per task: variants as points, references and floors as grey lines",
                      height=320 * panel_rows + 80, template="plotly_white", legend=dict(font=dict(size=10)),
                      margin=dict(t=90))
    return fig


def margin_table(top: pd.DataFrame) -> str:
    """Task x variant: mean and margin over the strongest reference, coloured by verdict; "" without references."""
    found = margins(top)
    if not found:
        return ""
    tasks = [t for t in task_order(top) if any(m.task == t for m in found)]
    labels = sorted({m.label for m in found})
    cells = {(m.task, m.label): m for m in found}
    head = "".join(f"<th>{html.escape(t)}</th>" for t in tasks)
    body = []
    for label in labels:
        row = [f"<td>{html.escape(label)}</td>"]
        for task in tasks:
            m = cells.get((task, label))
            if m is None:
                row.append("<td>-</td>")
                continue
            factor = scale(m.metric)
            colour = MARGIN_COLOURS.get(m.verdict, MARGIN_OTHER)
            tip = html.escape(f"{m.verdict}: {m.mean * factor:.4g} against {m.reference} "
                              f"{m.reference_value * factor:.4g} (n={m.n})")
            row.append(f'<td class="margin" style="background:{colour}" title="{tip}">'
                       f"{m.mean * factor:.3g} ({m.margin * factor:+.3g})</td>")
        body.append(f"<tr>{''.join(row)}</tr>")
    return (f'<table class="margins"><thead><tr><th>variant</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def quality_sections(run_dir: str | Path) -> tuple[list[str], list[str]]:
    """The page's sections of a training grid, and the commits of its rows."""
    df = load_quality(run_dir)
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: quality.csv has no rows yet; run or resume the grid")
    df = df.assign(kernel=kernels(df.kernel_path))
    top = headline(df)
    tasks = task_order(df)
    levels = floors(df)
    figures = [figure_div(_figure(top[top.metric == metric], metric, tasks, levels), f"metric-{metric}")
               for metric in sorted(top.metric.unique())]
    sections = [section("Test results per task and variant", *figures,
                        note="One panel per task. Points: variants (hover for the cell; click a legend "
                             "entry to hide or show one), error bars the standard deviation over seeds "
                             "(none with one seed). Grey dashed lines: the references, controls and "
                             "floors of that task. report.md has the tables and their intervals.")]
    table = margin_table(top)
    if table:
        sections.append(section(
            "Margin over the strongest reference", table,
            note="Each cell: the variant's mean over seeds and, in brackets, how far past the task's "
                 "strongest reference it is in the metric's better direction. Green: past it by two "
                 "seed standard deviations or more; yellow: past it within seed noise or with one "
                 "seed; red: below it. Hover a cell for the reference."))
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
