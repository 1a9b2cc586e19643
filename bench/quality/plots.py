"""Quality figures: the quality/speed Pareto front per task, each task's metrics by condition, recall against
state, and every registered variant's attention pattern."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attn import attention_info, create_attention, list_attention
from attn.mods import dense_allowed
from bench.quality.budget import figure_panels, plot_budget, pyplot, save_figure, split_budget
from bench.quality.margins import strongest_references
from bench.quality.reach import variant_recall_reach
from bench.quality.reference_unit import is_reference_row
from bench.quality.report import load_quality
from bench.quality.state_table import FIGURE, panel_title, panels_of, reference_floors, skip_reason, state_points
from bench.quality.tables import condition_table, headline, task_order, trained, uniform_chance
from bench.quality.tasks import ConditionView, condition_views, task_info

PARETO, PATTERNS = "pareto", "patterns"


def _front(points: pd.DataFrame, higher: bool) -> pd.DataFrame:
    """The points no other point beats in both throughput and quality."""
    ordered = points.sort_values("speed", ascending=False)
    best, keep = -np.inf if higher else np.inf, []
    for row in ordered.itertuples():
        if (row.quality > best) if higher else (row.quality < best):
            keep.append(row.Index)
            best = row.quality
    return points.loc[keep].sort_values("speed")


def _controls(top: pd.DataFrame) -> set[str]:
    """Labels of the trained rows that are not attention variants (controls, trained references)."""
    if "role" not in top:
        return set()
    return set(top[top.role.isin(["control", "reference"])].label)


def _colours(labels: list[str]) -> dict[str, Any]:
    """One colour per label, cycling through tab20 past twenty labels."""
    palette = pyplot().get_cmap("tab20").colors
    return {name: palette[i % len(palette)] for i, name in enumerate(labels)}


def plot_pareto(df: pd.DataFrame, run_dir: Path) -> list[Path]:
    """Test quality against training throughput, one panel per task; controls hollow and off the front."""
    top, tasks = headline(df), task_order(headline(df))
    strongest = strongest_references(top).set_index("task")
    top = trained(top)  # a computed reference has no training throughput: a line instead
    tasks = [t for t in tasks if t in set(top.task)]
    colours = _colours(sorted(set(top.label)))
    controls, chance = _controls(top), uniform_chance(df)
    fig, axes = figure_panels(len(tasks), 4.2, 3.6)
    for ax, task in zip(axes.flat, tasks):
        part = top[top.task == task]
        metric = part.metric.iloc[0]
        higher = metric != "bits_per_byte"
        roles = part.groupby("label").role.first()
        points = part.groupby("label").agg(speed=("train_tokens_per_s", "median"),
                                           quality=("value", "mean"), spread=("value", "std"))
        for name, p in points.iterrows():
            hollow = {"markerfacecolor": "white"} if name in controls else {}
            ax.errorbar(p.speed, p.quality, yerr=0 if np.isnan(p.spread) else p.spread, fmt="o",
                        color=colours[name], capsize=3,
                        label=name + (f" ({roles[name]})" if hollow else ""),
                        **hollow)
        front = _front(points[~points.index.isin(list(controls))], higher)
        ax.plot(front.speed, front.quality, "--", color="grey", linewidth=1)
        if metric == "accuracy" and task in chance:
            ax.axhline(chance[task], color="grey", linestyle=":", linewidth=1,
                       label="uniform chance")
        if task in strongest.index:
            ax.axhline(strongest.at[task, "value"], color="black", linestyle="-.", linewidth=1,
                       label="strongest reference without attention")
        ax.set_xscale("log")
        ax.set_title(task)
        ax.set_xlabel("training tokens/s")
        ax.set_ylabel(metric.replace("_", " "))
    legend: dict[str, Any] = {}
    for ax in axes.flat:  # every panel's entries once (a control or chance line may be in some)
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5),
               frameon=False)
    fig.suptitle(f"{run_dir.name}: quality against training throughput (dashed: Pareto front of "
                 "the variants; hollow: controls and trained references; dotted: uniform "
                 "chance; dash-dot: the task's strongest reference without attention)")
    fig.tight_layout()
    return save_figure(fig, run_dir, PARETO)


def _reach(row: pd.Series) -> int | bool | None:
    """The row's variant's reach by its mask (:mod:`bench.quality.reach`): ``None``: none, ``False``: no mask."""
    if is_reference_row(row) or "mixer" in (row.get("overrides") or ""):
        return False
    params = json.loads(row.params or "{}")  # the variant's defaults fill what it leaves out
    settings = json.loads(row.settings or "{}")
    return variant_recall_reach(row.variant, params, settings).reach


def plot_condition(df: pd.DataFrame, run_dir: Path, task: str,
                   view: ConditionView | None = None) -> list[Path]:
    """``task``'s metric against its condition, a line per variant, as ``view`` (default: the first with a figure)
    declares it."""
    view = view or next(v for v in task_info(task).conditions if v.figure is not None)
    figure = view.figure
    assert figure is not None, f"{task}: {view.prefix} has no figure"
    plt = pyplot()
    table = condition_table(df, task, view.metric, view.prefix, numeric=view.numeric)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = df[(df.task == task) & (df.status == "ok")].drop_duplicates("label")
    values = [float(c.split("=")[1]) for c in table.columns[1:]]
    colours = _colours(sorted(table.label)) if figure.reach else {}
    for _, row in table.iterrows():
        if not figure.reach:
            ax.plot(values, row.values[1:].astype(float), "o-", label=row.label)
            continue
        reach = _reach(rows[rows.label == row.label].iloc[0])
        name = row.label if reach is not None else f"{row.label} (reaches no distance)"
        ax.plot(values, row.values[1:].astype(float), "o-" if reach is not False else "s--",
                label=name, color=colours[row.label])
        if reach is not None and reach is not False and reach < max(values):
            ax.axvline(reach, color=colours[row.label], linestyle=":", linewidth=1)
    if figure.training_length:
        ax.axvline(min(values), color="grey", linestyle=":", linewidth=1, label="training length")
    if figure.reach:
        _floors(ax, df, task)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(figure.xlabel)
    ax.set_ylabel(figure.ylabel)
    ax.set_title(figure.title, **({"fontsize": 9} if "\n" in figure.title else {}))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return save_figure(fig, run_dir, figure.stem)


def _floors(ax: Any, df: pd.DataFrame, task: str) -> None:
    """Uniform chance dashed and the majority class dash-dotted across a figure of ``task``."""
    chance = uniform_chance(df).get(task)
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1,
                   label=f"uniform chance (1/{round(1 / chance)})")
    majority = df[(df.task == task) & (df.metric == "majority_accuracy") & (df.split == "test")]
    if len(majority):
        ax.axhline(majority.value.mean(), color="black", linestyle="-.", linewidth=1,
                   label="majority class")


def plot_quality_run(run_dir: str | Path) -> list[Path]:
    """Every quality figure the run's data allows."""
    run_dir = Path(run_dir)
    df, budget = split_budget(load_quality(run_dir))
    top = headline(df)
    if top.empty:
        raise ValueError(f"RUN_DIR {run_dir}: no finished training run to plot")
    paths = plot_pareto(df, run_dir)
    for task, view in condition_views():
        if view.figure is not None and len(condition_table(df, task, view.metric, view.prefix,
                                                           numeric=view.numeric)):
            paths += plot_condition(df, run_dir, task, view)
    paths += plot_budget(headline(budget), run_dir) if len(headline(budget)) else []
    paths += plot_recall_state(top, run_dir) if skip_reason(top) is None else []
    return paths


def plot_recall_state(top: pd.DataFrame, run_dir: Path) -> list[Path]:
    """``recall_state.png`` and ``.svg`` of the headline rows ``top``: test accuracy against the bytes a layer keeps,
    log scale, a panel per (recall task, width and training recipe); seed std as error bars; trained references and
    controls hollow; the floors as lines (uniform chance dotted, the computed references dash-dotted and dashed)."""
    points, floors = state_points(top), reference_floors(top)
    tasks, panels = task_order(points), panels_of(points)
    names = sorted(set(points.label))
    colours = _colours(names)
    markers = dict(zip(names, itertools.cycle("osD^vP*Xh<>p")))  # told apart where two colours are near
    fig, axes = pyplot().subplots(len(tasks), len(panels), figsize=(5.0 * len(panels), 3.8 * len(tasks)),
                                  squeeze=False)
    shown: dict[str, Any] = {}  # legend entries: the points, then the floors
    for (row, task), (col, (width, recipe)) in itertools.product(enumerate(tasks), enumerate(panels)):
        ax = axes[row, col]
        here = (points.task == task) & (points.width == width) & (points.recipe == recipe)
        if not here.any():  # a width or recipe trained on the other task only
            ax.axis("off")
            continue
        for p in points[here].itertuples():
            hollow = p.role != "variant"
            name = p.label + (f" ({p.role})" if hollow else "")
            shown.setdefault(name, ax.errorbar(
                p.state_bytes, p.mean, yerr=0 if np.isnan(p.std) else p.std, fmt=markers[p.label],
                color=colours[p.label], capsize=3, **({"markerfacecolor": "white"} if hollow else {})))
        styles = itertools.cycle(("-.", "--", (0, (5, 1, 1, 1, 1, 1))))
        for floor in floors[floors.task == task].itertuples():
            chance = floor.label == "uniform chance"
            line = ax.axhline(floor.value, color="grey" if chance else "black", linewidth=1,
                              linestyle=":" if chance else next(styles))
            shown.setdefault(f"floor: {floor.label}", line)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{task}, {panel_title(width, recipe)}", fontsize=9)
        ax.set_xlabel("state bytes per layer (log)")
        ax.set_ylabel("test accuracy")
    ordered = sorted(shown, key=lambda name: name.startswith("floor: "))
    fig.legend([shown[n] for n in ordered], ordered, loc="center left", bbox_to_anchor=(1.0, 0.5),
               frameon=False, fontsize=7)
    fig.suptitle(f"{run_dir.name}: recall against the state a layer keeps to answer (mean and std over "
                 "seeds; hollow: trained references and controls; lines: the floors)")
    fig.tight_layout()
    return save_figure(fig, run_dir, FIGURE)


def _pattern(name: str, params: dict[str, Any], n: int) -> np.ndarray:
    """The allowed pairs ``(n, n)`` of ``name(params)`` (all pairs without a mask_mod)."""
    module = create_attention(name, num_heads=1, head_dim=8, **params)
    allowed = dense_allowed(module.mask_mod(), batch=1, heads=1, q_len=n, k_len=n,
                            causal=module.forces_causal, key_mask=None, device="cpu")
    return np.ones((n, n)) if allowed is None else allowed[0, 0].numpy().astype(float)


def _illustrative_pattern(name: str, examples: tuple[dict[str, Any], ...], n: int
                          ) -> tuple[dict[str, Any], np.ndarray]:
    """The variant's example parameters whose pattern is nearest a third of the pairs (shows its shape)."""
    candidates = [{k: v for k, v in p.items() if k != "position_bias"} for p in examples or ({},)]
    patterns = []
    for params in candidates:
        try:
            patterns.append((params, _pattern(name, params, n)))
        except ValueError:  # a per-head pattern (e.g. dilation=(1, 2)) needs several heads
            continue
    return min(patterns, key=lambda item: abs(item[1].mean() - 0.3))


def plot_patterns(out_dir: str | Path, n: int = 24) -> list[Path]:
    """Allowed (query, key) pairs of every registered variant at length ``n`` (non-causal)."""
    names = [name for name in list_attention() if not name.startswith("bench_")]
    fig, axes = figure_panels(len(names), 2.8, 3.4)
    for ax, name in zip(axes.flat, names):
        info = attention_info(name)
        params, grid = _illustrative_pattern(name, info.example_params, n)
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        ax.grid(False)
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        note = "" if info.exact else "\n(approximates all pairs)"
        ax.set_title(f"{name}\n{shown}{note}", fontsize=8)
        ax.set_xlabel("key j", fontsize=7)
        ax.set_ylabel("query i", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"allowed (query, key) pairs at N={n}")
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out_dir, PATTERNS)
