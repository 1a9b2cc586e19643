"""``history.html``: every figure against commit time, a series per machine, regressions marked (docs/history.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import plotly.io as pio

from bench.html.history_rows import FIGURES
from bench.html.history_steps import STEP_COLUMNS, regressions, series_points
from bench.html.page import figure_div, render_page, safe_link, section, table_html, write_page
from bench.speed.compare import FAILING

PAGE_FILE = "history.html"
HOVER = ("<b>%{customdata[0]}</b><br>commit %{customdata[1]} (%{x})<br>value %{y:.4g} "
         "(spread %{customdata[2]}, n=%{customdata[3]})<br>status %{customdata[4]}<br>"
         "step from the previous commit: %{customdata[5]}<br>run %{customdata[6]} (click to open)"
         "<extra>%{fullData.name}</extra>")
#: where a run's page is, first found first
_PAGES = ("report.html", "report.md", "summary.md")


def page_link(run: str, out: Path) -> str:
    """The path from the history page to a run's page (its directory where it has none)."""
    for name in _PAGES:
        if (out / run / name).is_file():
            return f"{run}/{name}"
    return f"{run}/"


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _trace_data(points: list[dict], figure: str, marks: Mapping[str, str], out: Path) -> dict:
    """The arrays of one machine's trace of one case (x, y, bars, hover, marker)."""
    classes = [marks.get(p["commit_sha"], "") for p in points]
    custom = [(p["case"], p["commit_sha"][:12], "-" if _missing(p["spread"]) else f"{p['spread']:.3g}",
               "-" if _missing(p["n"]) else int(p["n"]), p["status"], cls or "(first)", p["run"],
               safe_link(page_link(p["run"], out)) or "") for p, cls in zip(points, classes)]
    flagged = [cls in FAILING for cls in classes]
    spreads = [0.0 if _missing(p["spread"]) else float(p["spread"]) for p in points]
    return {"x": [p["commit_time"] for p in points],
            "y": [None if _missing(p["value"]) else float(p["value"]) for p in points],
            # the error bar: ± half the IQR of a time or memory, ± the std over seeds otherwise
            "error_y": {"type": "data", "array": [s / 2.0 for s in spreads] if figure in FIGURES else spreads,
                        "visible": True},
            "customdata": custom,
            "marker": {"color": ["#d62728" if f else "#1f77b4" for f in flagged],
                       "symbol": ["x" if f else "circle" for f in flagged], "size": [14 if f else 8 for f in flagged]}}


def history_figure(rows: pd.DataFrame, steps: pd.DataFrame, figure: str, out: Path) -> dict:
    """One figure as Plotly's JSON (plain data: validating hundreds of menu entries costs seconds), a menu of cases."""
    machines = sorted(rows.machine.unique())
    bad = set(regressions(steps).case)
    cases = sorted(rows.case.unique(), key=lambda c: (c not in bad, c))
    series = series_points(rows)
    marks: dict[tuple[str, str], dict[str, str]] = {}
    for step in steps.itertuples(index=False):
        marks.setdefault((step.case, step.machine), {})[step.commit_b] = step[STEP_COLUMNS.index("class")]
    per_case = [[_trace_data(series.get((figure, case, where), []), figure, marks.get((case, where), {}), out)
                 for where in machines] for case in cases]
    title = str(rows.title.iloc[0])  # the figure's, kept with its rows (figure_meta)
    buttons = [{"label": case, "method": "update",
                "args": [{key: [data[key] for data in arrays] for key in arrays[0]},
                         {"title.text": f"{title}: {case}"}]}
               for case, arrays in zip(cases, per_case)]
    traces = [{"type": "scatter", "name": where, "mode": "lines+markers", "hovertemplate": HOVER, **data}
              for where, data in zip(machines, per_case[0])]
    template = pio.templates["plotly_white"].to_plotly_json()
    layout = {"title": {"text": f"{title}: {cases[0]}", "y": 0.98, "yanchor": "top"},
              "xaxis": {"title": {"text": "commit time"}},
              "yaxis": {"title": {"text": title}}, "height": 480, "template": template,
              "margin": {"t": 150}, "showlegend": True,
              "updatemenus": [{"buttons": buttons, "direction": "down", "x": 0, "xanchor": "left", "y": 1.16,
                               "yanchor": "top", "showactive": True}]}
    return {"data": traces, "layout": layout}


def _commits_table(rows: pd.DataFrame, out: Path) -> pd.DataFrame:
    grouped = rows.groupby(["commit_sha", "commit_time", "commit_time_source"])
    table = grouped.agg(machines=("machine", lambda m: "; ".join(sorted(set(m)))),
                        runs=("run", lambda r: "; ".join(sorted(set(r)))), rows=("case", "size")).reset_index()
    first_run = [r.split("; ")[0] for r in table.runs]
    return table.assign(commit=table.commit_sha.str.slice(0, 12), page=[page_link(r, out) for r in first_run]) \
        .sort_values("commit_time")[["commit", "commit_time", "commit_time_source", "machines", "runs", "rows", "page"]]


def _series_table(rows: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    latest = rows.sort_values(["commit_time", "timestamp"]).groupby(["figure", "case", "machine"]).agg(
        commits=("commit_sha", "nunique"), latest_value=("value", "last"), latest_status=("status", "last"),
        kind=("kind", "first")).reset_index()
    last_step = steps.drop_duplicates(["figure", "case", "machine"], keep="last")[
        ["figure", "case", "machine", "class"]].rename(columns={"class": "newest_step"})
    table = latest.merge(last_step, on=["figure", "case", "machine"], how="left")
    table["newest_step"] = table.newest_step.fillna("(one commit)")
    return table[["kind", "figure", "case", "machine", "commits", "latest_value", "latest_status", "newest_step"]]


def write_history_page(rows: pd.DataFrame, steps: pd.DataFrame, out: Path, provenance: Mapping[str, str],
                       rule: str) -> Path:
    """Write ``out/history.html``; its path."""
    figures = [figure_div(history_figure(rows[rows.figure == f], steps[steps.figure == f], f, out),
                          f"history-{f}", links=True)
               for f in sorted(rows.figure.unique())]
    flagged = regressions(steps)
    shown = flagged.assign(commit_a=flagged.commit_a.str.slice(0, 12), commit_b=flagged.commit_b.str.slice(0, 12),
                           page=[page_link(r, out) for r in flagged.run_b])
    shown = shown[["class", "figure", "case", "machine", "commit_a", "commit_b", "value_a", "value_b",
                   "change_pct", "noise", "run_b", "page"]]
    series = _series_table(rows, steps)
    marks = ["regression" if step in FAILING else
             "failed" if status != "ok" else "" for step, status in zip(series.newest_step, series.latest_status)]
    sections = [
        section("Figures against commits", *figures,
                note="Choose a case in a figure's menu (cases with a regression first). One series per "
                     "machine; error bars: ± half the repeats' IQR (time, memory) or ± the standard "
                     "deviation over seeds (quality). A red x is a step beyond the spread "
                     f"({rule}). Click a point to open its run's page."),
        section(f"Regressions ({len(flagged)} step(s))",
                table_html(shown, "regressions", marks=["regression"] * len(shown), links={"run_b": "page"},
                           filters={"figure": "figure", "machine": "machine"}),
                note="Steps between consecutive commits on one machine that moved beyond the spread "
                     f"({rule}); change_pct is of the value as recorded."),
        section("Series", table_html(series, "series", marks=marks,
                                     filters={"kind": "kind", "figure": "figure", "machine": "machine"}),
                note="Every case on every machine: its commits, latest value and newest step."),
        section("Commits", table_html(_commits_table(rows, out), "commits", links={"commit": "page"}),
                note="The commits the runs' rows came from, by commit time (source git: the "
                     "repository's commit time; first row: not in this repository, its earliest row)."),
    ]
    return write_page(out / PAGE_FILE, render_page("History across runs", provenance, sections))

