"""Scaling plots: time and memory against N per pass, a line per kernel that ran, as the report fits them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.engine.row_schema import SPEED_PASSES
from bench.speed.results import load_results
from bench.speed.scaling import kernel_ran, spread_interval

PLOT_STEM = "scaling"
_METRICS = (("time_ms", "median time (ms), band: IQR of repeats"),
            ("peak_mem_mib", "peak tensor memory above inputs (MiB)"))

#: markers of the kernels that ran (others: a circle)
MARKERS = {"sdpa": "o", "blocked": "s", "chunked": "D", "flex": "^", "native": "P",
           "xformers": "v", "reference": "X"}
NOISY_LEGEND = "noisy (left out of fits)"


def _curves(ax, data: pd.DataFrame, metric: str, palette: dict) -> None:
    """One line per (variant, requested kernel, kernel that ran), IQR band for time, noisy rows as crosses."""
    quiet, noisy = data[~data.noisy], data[data.noisy]
    groups = sorted(quiet.groupby(["label", "kernel_requested", "ran"]),
                    key=lambda group: (*group[0][:2], group[1].seq_len.min()))
    for (label, requested, ran), curve in groups:  # a curve's segments in order of N
        curve = curve.sort_values("seq_len")
        color = palette[label]
        ax.plot(curve.seq_len, curve[metric], marker=MARKERS.get(ran, "o"), color=color,
                label=f"{label} [{ran if ran == requested else f'{requested}: {ran}'}]")  # window [auto: sdpa]
        if metric == "time_ms":
            ax.fill_between(curve.seq_len, curve.time_q25, curve.time_q75, color=color,
                            alpha=0.2, linewidth=0)
    for label, points in noisy.groupby("label"):
        ax.scatter(points.seq_len, points[metric], marker="x", color=palette[label], s=40)


def _legend(fig, axes, noisy: bool) -> None:
    """One legend for the figure: every panel's entries once, and a cross for noisy rows."""
    from matplotlib.lines import Line2D  # plotting stack: heavy, imported only to draw

    entries: dict[str, object] = {}
    for ax in np.ravel(axes):
        for handle, name in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(name, handle)
    if noisy:
        entries[NOISY_LEGEND] = Line2D([], [], marker="x", linestyle="", color="grey")
    fig.legend(list(entries.values()), list(entries), loc="center left",
               bbox_to_anchor=(1.0, 0.5), frameon=False)


def _guides(ax, data: pd.DataFrame, column: str) -> bool:
    """Slope-1 and slope-2 guides from the panel's smallest N; ``False`` under two lengths."""
    values = data[data[column] > 0]
    if values.empty or values.seq_len.nunique() < 2:
        return False
    n0, n1 = float(values.seq_len.min()), float(values.seq_len.max())
    y0 = float(np.exp(np.log(values[values.seq_len == n0][column]).mean()))
    xs = np.array([n0, n1])
    for slope, style in ((1, "--"), (2, ":")):
        ax.plot(xs, y0 * (xs / n0) ** slope, style, color="grey", linewidth=1.2,
                label=f"slope {slope}")
    return True


def figure_title(name: str, meta: pd.Series, guided: bool) -> str:
    """The figure's title: the run and its shape, and the slope guides only when drawn."""
    text = (f"{name}: B={meta['batch']} H={meta['heads']} D={meta['head_dim']} "
            f"{meta['dtype']} on {meta['device']} ({meta['device_name']})")
    return text + ("; dashed: slope 1, dotted: slope 2" if guided else "")


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw the scaling figure of ``run_dir``; returns the written files."""
    import matplotlib  # plotting stack: heavy, imported only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    run_dir = Path(run_dir)
    df = load_results(run_dir)
    ok = df[df.status == "ok"].copy()
    if ok.empty:
        raise ValueError(f"{run_dir}: no ok rows to plot")
    ok["peak_mem_mib"] = ok.peak_mem_bytes / 2**20
    ok["seq_len"] = ok.seq_len.astype(float)
    ok["ran"] = kernel_ran(ok)
    quartiles = [spread_interval(t, m, math.nan) for t, m in zip(ok.times_ms, ok.time_ms)]
    ok["time_q25"] = [q[0] for q in quartiles]
    ok["time_q75"] = [q[1] for q in quartiles]
    passes = [p for p in SPEED_PASSES if p in set(ok["pass"])]
    labels = sorted(ok.label.unique())
    palette = dict(zip(labels, sns.color_palette("tab10", len(labels))))
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(len(_METRICS), len(passes), figsize=(5.2 * len(passes), 8.5),
                             squeeze=False)
    guided = False
    for col, pass_name in enumerate(passes):
        data = ok[ok["pass"] == pass_name]
        for row, (metric, title) in enumerate(_METRICS):
            ax = axes[row][col]
            _curves(ax, data, metric, palette)
            guided = _guides(ax, data, metric) or guided
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(title)
            ax.set_title(f"{pass_name}: {title.split(' (')[0]}")
    _legend(fig, axes, bool(ok.noisy.any()))
    meta = df.iloc[0]
    fig.suptitle(figure_title(run_dir.name, meta, guided))
    fig.tight_layout()
    paths = [run_dir / f"{PLOT_STEM}.png", run_dir / f"{PLOT_STEM}.svg"]
    for path in paths:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return paths
