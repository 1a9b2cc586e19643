"""The page of a decoding benchmark: tokens/s with and without the KV cache, the streaming step, every row."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from bench.decoding.results import load_decoding
from bench.html.page import figure_div, section, table_html

DECODING_HOVER = ("<b>%{customdata[0]}</b> (%{customdata[1]})<br>context %{x}<br>%{y:.4g} tokens/s "
                  "(median of %{customdata[2]} repeats; no spread recorded)<br>status ok<extra></extra>")
STREAMING_HOVER = ("<b>%{customdata[0]}</b><br>window %{x}<br>%{y:.4g} ms per step (median of "
                   "%{customdata[1]} repeats; no spread recorded)<br>status ok<extra></extra>")


def _decoding_figure(rows: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for (attention, cached), part in rows.groupby(["attention", "use_cache"], sort=True):
        part = part.sort_values("context")  # (contexts,)
        how = "KV cache" if cached else "no cache"
        fig.add_trace(go.Scatter(
            x=part.context.astype(int).tolist(), y=part.tokens_per_s.tolist(), mode="lines+markers",
            name=f"{attention}, {how}", hovertemplate=DECODING_HOVER,
            customdata=[(attention, how, int(r)) for r in part.repeats]))
    fig.update_layout(title="Greedy decoding, tokens/s (prefill included)", xaxis_title="context (tokens)",
                      yaxis_title="tokens/s", xaxis_type="log", yaxis_type="log", height=440,
                      template="plotly_white")
    return fig


def _streaming_figure(rows: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for layers, part in rows.groupby("num_layers", sort=True):
        part = part.sort_values("window")  # (windows,)
        for column, what in (("step_ms", "streaming step"), ("recompute_ms", "recompute the window")):
            name = f"{what}, {int(layers)} layer(s)"
            fig.add_trace(go.Scatter(
                x=part.window.astype(int).tolist(), y=part[column].tolist(), mode="lines+markers", name=name,
                hovertemplate=STREAMING_HOVER, customdata=[(name, int(r)) for r in part.repeats]))
    fig.update_layout(title="Streaming encoder: one step against recomputing the window", xaxis_title="window",
                      yaxis_title="ms per step", xaxis_type="log", yaxis_type="log", height=440,
                      template="plotly_white")
    return fig


def decoding_sections(run_dir: str | Path) -> tuple[list[str], list[str]]:
    """The page's sections of a decoding run, and the commits of its rows."""
    df = load_decoding(run_dir)
    decoding = df[df.benchmark == "decoding"]
    streaming = df[df.benchmark == "streaming"]
    figures = ([figure_div(_decoding_figure(decoding), "decoding")] if len(decoding) else []) + \
              ([figure_div(_streaming_figure(streaming), "streaming")] if len(streaming) else [])
    table = df.assign(kernel="-")[[c for c in ["benchmark", "attention", "kernel", "context", "use_cache",
                                               "tokens_per_s", "decode_tokens_per_s", "window", "num_layers",
                                               "step_ms", "recompute_ms", "speedup", "repeats"] if c in df.columns
                                   or c == "kernel"]]
    return [section("Decoding and streaming", *figures,
                    note="Each point is the median of its repeats; this benchmark records no "
                         "spread. Hover a point for its row; click a legend entry to hide or show it."),
            section("Every row", table_html(table, "rows", marks=[""] * len(table),
                                            filters={"variant": "attention", "kernel": "kernel",
                                                     "task": "benchmark"}),
                    note="Click a header to sort by it; the selects show one attention or benchmark. "
                         "The benchmark does not record which kernel ran (kernel: -).")], \
        df.git_sha.dropna().astype(str).tolist()
