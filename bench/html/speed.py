"""The page of a speed sweep: time and memory against N per pass, and every row (docs/history.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from bench.engine.row_schema import SPEED_PASSES
from bench.html.page import figure_div, section, table_html
from bench.html.palette import GREY, series_styles
from bench.speed.results import load_results
from bench.speed.scaling import fit_exponent

MIB = 2**20
HOVER = ("<b>%{customdata[0]}</b><br>kernel %{customdata[1]} (requested %{customdata[2]})<br>"
         "N=%{customdata[3]}<br>time %{customdata[4]:.4g} ms (IQR %{customdata[5]:.3g} ms, "
         "n=%{customdata[6]})<br>memory %{customdata[7]:.4g} MiB<br>status %{customdata[8]}"
         "<extra></extra>")
TABLE_COLUMNS = ["label", "kernel_requested", "kernel", "pass", "seq_len", "time_ms", "time_iqr_ms",
                 "repeats", "peak_mem_mib", "status", "reason"]


def guides(x: list[int], y: list[float]) -> list[go.Scatter]:
    """Grey lines from the geometric mean of the smallest N's values growing as N and N^2: exponents 1 and 2."""
    low, high = min(x), max(x)
    anchor = float(pd.Series(y).clip(lower=1e-12).pipe(lambda s: s.apply(math.log)).mean())
    return [go.Scatter(x=[low, high], y=[math.exp(anchor), math.exp(anchor) * (high / low) ** power],
                       mode="lines", name=f"guide: grows as {name}", hoverinfo="skip", legendgroup="guides",
                       line=dict(color=GREY, dash="dot", width=1))
            for power, name in ((1, "N"), (2, "N^2"))]


def _legend_name(label: str, requested: str, n: pd.Series, y: pd.Series) -> str:
    exponent = fit_exponent(n, y) if n.nunique() >= 3 else math.nan
    return f"{label} [{requested}]" + ("" if math.isnan(exponent) else f" ~N^{exponent:.2f}")


def _figure(ok: pd.DataFrame, column: str, title: str, y_title: str) -> go.Figure:
    """One series per (label, kernel_requested) of ``ok`` rows: ``column`` against N."""
    fig = go.Figure()
    groups = list(ok.groupby(["label", "kernel_requested"], sort=True))
    first = []  # (N, value) of each series at its smallest N, for the guides
    for ((label, requested), rows), (colour, symbol) in zip(groups, series_styles(len(groups))):
        rows = rows.sort_values("seq_len")  # (points,)
        status = ["ok, noisy" if noisy else "ok" for noisy in rows.noisy]
        custom = list(zip(rows.label, rows.kernel, rows.kernel_requested, rows.seq_len.astype(int),
                          rows.time_ms, rows.time_iqr_ms.fillna(0), rows.repeats.fillna(0).astype(int),
                          rows.peak_mem_bytes / MIB, status))
        error = dict(type="data", array=(rows.time_iqr_ms.fillna(0) / 2).tolist(), visible=True) \
            if column == "time_ms" else None
        values = rows[column] / (MIB if column == "peak_mem_bytes" else 1)  # (points,)
        clean = ~rows.noisy.astype(bool)
        fig.add_trace(go.Scatter(
            x=rows.seq_len.astype(int).tolist(), y=values.tolist(), mode="lines+markers",
            name=_legend_name(label, requested, rows.seq_len[clean], values[clean]), customdata=custom,
            hovertemplate=HOVER, error_y=error, line=dict(color=colour),
            marker=dict(symbol=[f"{symbol}-open" if n else symbol for n in rows.noisy], size=8, color=colour)))
        first.append((int(rows.seq_len.iloc[0]), float(values.iloc[0])))
    if first:
        smallest = min(n for n, _ in first)
        at_smallest = [v for n, v in first if n == smallest and v > 0]
        if at_smallest and ok.seq_len.nunique() > 1:
            fig.add_traces(guides([smallest, int(ok.seq_len.max())], at_smallest))
    fig.update_layout(title=title, xaxis_title="N (sequence length)", yaxis_title=y_title,
                      xaxis_type="log", yaxis_type="log", height=480, template="plotly_white",
                      legend=dict(font=dict(size=10)))
    return fig


def speed_sections(run_dir: str | Path) -> tuple[list[str], list[str]]:
    """The page's sections of a speed run, and the commits of its rows."""
    df = load_results(run_dir, rows_required=True)
    ok = df[(df.status == "ok") & df.time_ms.notna()]
    sections = []
    for pass_name in [p for p in SPEED_PASSES if (df["pass"] == p).any()]:
        rows = ok[ok["pass"] == pass_name]
        failed = int(((df["pass"] == pass_name) & (df.status != "ok")).sum())
        note = ("Hover a point for its row; click a legend entry to hide or show its series. "
                "Error bars: ± half the IQR of the repeats; a hollow point is a noisy row. "
                + (f"{failed} row(s) of this pass did not run (no point; marked in the table)." if failed else ""))
        sections.append(section(
            f"Pass {pass_name}: time and memory against N",
            figure_div(_figure(rows, "time_ms", f"Median time, {pass_name}", "time (ms)"), f"time-{pass_name}"),
            figure_div(_figure(rows, "peak_mem_bytes", f"Peak tensor memory above inputs, {pass_name}",
                               "memory (MiB)"), f"memory-{pass_name}"), note=note))
    table = df.assign(peak_mem_mib=df.peak_mem_bytes / MIB, reason=df.reason.str.slice(0, 160))
    table = table.sort_values(["pass", "label", "kernel_requested", "seq_len"])
    marks = ["failed" if status != "ok" else "noisy" if noisy else ""
             for status, noisy in zip(table.status, table.noisy)]
    sections.append(section(
        "Every row", table_html(table[TABLE_COLUMNS], "rows", marks=marks,
                                filters={"variant": "label", "kernel": "kernel_requested", "pass": "pass"}),
        note="Click a header to sort by it; the selects show one variant, kernel or pass. "
             "failed: the case did not run ok (its status and reason); noisy: measured under "
             "contention (docs/measurement.md)."))
    return sections, df.git_sha.dropna().astype(str).tolist()
