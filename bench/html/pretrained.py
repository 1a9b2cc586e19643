"""The page of a pretrained-model run: quality against prefill time, perplexity along the stream, every row."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from bench.html.page import figure_div, section, table_html
from bench.pretrained.report import load_pretrained, passkey_table, perplexity_table, tradeoff_table

TRADE_HOVER = ("<b>%{customdata[0]}</b><br>N %{customdata[1]}<br>prefill %{x:.3g} s (median of "
               "%{customdata[2]} interleaved rounds)<br>%{customdata[3]} %{y:.4g}<br>peak "
               "%{customdata[4]:.0f} MiB<extra></extra>")
STREAM_HOVER = "<b>%{customdata}</b><br>tokens ..%{x}<br>perplexity %{y:.4g}<extra></extra>"


def _trade_figure(df: pd.DataFrame) -> go.Figure | None:
    """Perplexity and passkey accuracy against prefill time, a trace per N, marker size the peak memory."""
    cost = df[(df.task == "prefill") & (df.status == "ok")]
    ppl, keys = perplexity_table(df), passkey_table(df)
    if cost.empty or ppl.empty:
        return None
    fig = go.Figure()
    biggest = max(float(cost.peak_mem_bytes.max()), 1.0)
    for n, at in cost.groupby("seq_len"):
        at = at.set_index("label")
        quality = ppl.set_index("pattern").get(str(int(n)))
        for name, values in (("perplexity", quality),
                             ("passkey accuracy", None if keys.empty else
                              keys[keys.N == n].set_index("pattern").accuracy)):
            if values is None:
                continue
            shown = [p for p in values.index if p in at.index]
            if not shown:
                continue
            fig.add_trace(go.Scatter(
                x=[at.loc[p, "value"] / 1e3 for p in shown], y=[values[p] for p in shown],
                mode="markers", name=f"{name}, N={int(n)}", yaxis="y" if name == "perplexity" else "y2",
                marker={"size": [8 + 30 * at.loc[p, "peak_mem_bytes"] / biggest for p in shown]},
                hovertemplate=TRADE_HOVER,
                customdata=[(p, int(n), int(at.loc[p, "repeats"]), name,
                             at.loc[p, "peak_mem_bytes"] / 2**20) for p in shown]))
    fig.update_layout(title="Quality against prefill time (marker size: peak memory)",
                      xaxis_title="prefill time (s)", yaxis={"title": "perplexity", "type": "log"},
                      yaxis2={"title": "passkey accuracy", "overlaying": "y", "side": "right",
                              "range": [0, 1.05]},
                      height=480, template="plotly_white")
    return fig


def _stream_figure(df: pd.DataFrame) -> go.Figure | None:
    rows = df[(df.task == "streaming") & (df.metric == "perplexity") & (df.status == "ok")]
    if rows.empty:
        return None
    fig = go.Figure()
    for label, part in rows.groupby("label", sort=False):
        part = part.sort_values("seq_len")
        fig.add_trace(go.Scatter(x=part.seq_len.astype(int).tolist(), y=part.value.tolist(),
                                 mode="lines+markers", name=str(label), hovertemplate=STREAM_HOVER,
                                 customdata=[str(label)] * len(part)))
    fig.update_layout(title="Perplexity along the stream (the trained context is 8,192 tokens)",
                      xaxis_title="tokens read", yaxis={"title": "perplexity", "type": "log"},
                      height=440, template="plotly_white")
    return fig


def pretrained_sections(run_dir: str | Path) -> tuple[list[str], list[str]]:
    """The page's sections of a pretrained-model run, and the commits of its rows."""
    df = load_pretrained(run_dir)
    figures = [figure_div(fig, name) for fig, name in ((_trade_figure(df), "tradeoff"),
                                                        (_stream_figure(df), "stream")) if fig is not None]
    table = df[["task", "label", "document", "seq_len", "depth", "positions", "metric", "value",
                "ci_low", "ci_high", "status", "reason", "kernel_path"]].rename(
        columns={"label": "variant", "kernel_path": "kernel"})
    glance = tradeoff_table(df)
    return [section("Quality and cost on a pretrained model", *figures,
                    note="Every pattern replaces the model's attention untrained; "
                         "docs/pretrained.md says what each task measures."),
            *([section("The trade-off at a glance", table_html(glance, "tradeoff-table"),
                       note="Perplexity and prefill time as multiples of full attention's, passkey "
                            "keys retrieved; report.md has each with its spread.")] if len(glance) else []),
            section("Every row", table_html(table, "rows", marks=[""] * len(table),
                                            filters={"variant": "variant", "task": "task"}),
                    note="Click a header to sort by it; the selects show one pattern or task.")], \
        df.git_sha.dropna().astype(str).tolist()
