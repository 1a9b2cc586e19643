"""Quality at matched compute: training FLOPs per step, step counts from a FLOP budget, the budget figure and
table (docs/quality.md, "Quality at matched compute"), and the pyplot setup every quality figure shares."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from attn import Attention
from attn.cost import CostQuery
from bench.engine.config import ConfigError
from bench.engine.markdown import markdown_table
from bench.engine.row_schema import BUDGET_COLUMNS
from bench.quality.settings import TrainSettings
from bench.quality.tasks import display_unit, order_tasks

#: the attention whose FLOPs at the preset's steps define ``budget_x: 1``
REFERENCE = "full"
BUDGET_FIGURE = "budget"
DENSE_BWD_FACTOR = 2  # backward of a dense layer: gradients of inputs and of weights


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step (forward + backward), by where they are spent."""

    dense: int  # every matmul outside attention: projections, FFN, embeddings, heads
    attention: int  # every attention call's cost (forward + backward)
    attention_kind: str = "useful"  # "useful", "performed" or "full_equivalent" (attn/cost.py)

    @property
    def total(self) -> int:
        """Dense plus attention FLOPs of the step."""
        return self.dense + self.attention


class _Tally:
    """Forward FLOPs gathered by module hooks during one forward pass."""

    def __init__(self, model: nn.Module) -> None:
        self.inside = {id(sub) for module in model.modules() if isinstance(module, Attention)
                       for sub in module.modules()}
        self.dense_fwd = 0
        self.attention = 0
        self.kinds: set[str] = set()

    def linear(self, module: nn.Linear, inputs: tuple[Any, ...], _: Any) -> None:
        rows = inputs[0].numel() // module.in_features
        self.dense_fwd += 2 * rows * module.in_features * module.out_features

    def conv(self, module: nn.Conv2d, _: tuple[Any, ...], output: torch.Tensor) -> None:
        per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
        self.dense_fwd += 2 * output.numel() * per_output

    def call(self, module: Attention, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        q, k, v = (list(args) + [kwargs.get(n) for n in ("q", "k", "v")[len(args):]])[:3]
        causal = bool(kwargs.get("causal", False)) or module.forces_causal
        query = CostQuery(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3],
                          causal=causal, has_key_mask=kwargs.get("key_mask") is not None)
        cost = module.cost(query)
        self.attention += cost.fwd_bwd
        self.kinds.add(cost.kind)


def count_step_flops(model: nn.Module, forward: Callable[[], Any]) -> StepFlops:
    """FLOPs of one training step of ``model`` from one ``forward()`` (no gradients, eval mode, RNG untouched)."""
    tally = _Tally(model)
    handles = []
    for module in model.modules():
        if id(module) in tally.inside and not isinstance(module, Attention):
            continue  # an attention's own matmuls are part of its cost
        if isinstance(module, Attention):
            handles.append(module.register_forward_pre_hook(tally.call, with_kwargs=True))
        elif isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(tally.linear))
        elif isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(tally.conv))
    was_training = model.training
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            forward()
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    kind = "+".join(sorted(tally.kinds)) or "useful"
    return StepFlops(dense=(1 + DENSE_BWD_FACTOR) * tally.dense_fwd, attention=tally.attention,
                     attention_kind=kind)


def task_step_flops(model: nn.Module, task: Any, batch_size: int, device: str = "cpu") -> StepFlops:
    """FLOPs of one training step of ``model`` on ``task`` (step 0's batch: all share one shape)."""
    batch = {k: v.to(device) for k, v in task.train_batch(0, batch_size).items()}
    return count_step_flops(model, lambda: task.loss(model, batch))


@dataclass(frozen=True)
class Budget:
    """What a budget gave one run: the FLOPs, the steps they buy, the stretched schedule."""

    budget_x: float
    flop_budget: int  # budget_x * reference FLOPs per step * train.steps
    flops_per_step: int
    reference_flops_per_step: int
    train: TrainSettings  # the run's schedule: steps = floor(flop_budget / flops_per_step)

    def columns(self) -> dict[str, Any]:
        """The budget columns of the run's rows."""
        return {"budget_x": self.budget_x, "flop_budget": self.flop_budget,
                "flops_per_step": self.flops_per_step,
                "train_flops": self.flops_per_step * self.train.steps}


def flop_budget(budget_x: float, reference_flops_per_step: int, reference_steps: int) -> int:
    """``budget_x`` times the reference's FLOPs in ``reference_steps`` steps (exact, floored)."""
    return math.floor(Fraction(budget_x) * reference_flops_per_step * reference_steps)


def stretched(train: TrainSettings, steps: int) -> TrainSettings:
    """``train`` run for ``steps`` steps, warm-up and validation interval scaled (``checkpoint_every`` stays)."""
    scale = Fraction(steps, train.steps)
    warmup = min(round(train.warmup_steps * scale), steps - 1)
    return dataclasses.replace(train, steps=steps, warmup_steps=max(warmup, 0),
                               eval_every=max(1, round(train.eval_every * scale)))


def matched_budget(train: TrainSettings, flops_per_step: int, reference_flops_per_step: int
                   ) -> Budget:
    """The steps and schedule that ``train.budget_x`` buys a model of ``flops_per_step``."""
    if train.budget_x is None:
        raise ValueError("train.budget_x: must be set to match a budget; got None")
    if flops_per_step < 1:
        raise ValueError(f"flops_per_step: must be >= 1; got {flops_per_step}")
    budget = flop_budget(train.budget_x, reference_flops_per_step, train.steps)
    steps = budget // flops_per_step
    if steps < 1:
        raise ConfigError(f"train.budget_x: must buy at least one step; got {train.budget_x!r} "
                          f"({budget} FLOPs, one step costs {flops_per_step})", "train.budget_x")
    return Budget(train.budget_x, budget, flops_per_step, reference_flops_per_step,
                  stretched(train, steps))


def parse_budgets(raw: Any, tasks: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """A grid's ``budgets: {tasks: [...], x: [...]}``, checked: ``(tasks, multiples)``."""
    if raw is None:
        return (), ()
    if not isinstance(raw, dict) or set(raw) != {"tasks", "x"}:
        raise ConfigError(f"config key 'budgets': must be a mapping {{tasks: [...], x: [...]}}; "
                          f"got {raw!r}", "budgets")
    chosen = raw["tasks"]
    if not isinstance(chosen, list) or not chosen or any(t not in tasks for t in chosen):
        raise ConfigError(f"config key 'budgets.tasks': must be a non-empty list of the grid's "
                          f"tasks {list(tasks)}; got {chosen!r}", "budgets.tasks")
    multiples = raw["x"]
    if (not isinstance(multiples, list) or not multiples
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0
                   or not math.isfinite(x) for x in multiples)):
        raise ConfigError(f"config key 'budgets.x': must be a non-empty list of numbers > 0; got "
                          f"{multiples!r}", "budgets.x")
    return tuple(dict.fromkeys(chosen)), tuple(dict.fromkeys(float(x) for x in multiples))


def budget_overrides(budget_x: float) -> dict[str, Any]:
    """The settings overrides of a budget unit (``RunSpec.overrides``)."""
    return {"train": {"budget_x": float(budget_x)}}


def budget_of(overrides: dict[str, Any] | None) -> float | None:
    """The ``budget_x`` that ``overrides`` ask for, None for an equal-steps run."""
    value = ((overrides or {}).get("train") or {}).get("budget_x")
    return None if value is None else float(value)


def strip_budget(overrides: dict[str, Any], allowed: Collection[float]) -> dict[str, Any] | None:
    """``overrides`` less their budget, or None when the budget is not one of ``allowed``."""
    budget = budget_of(overrides)
    if budget is None:
        return overrides
    if budget not in allowed:
        return None
    train = {k: v for k, v in overrides["train"].items() if k != "budget_x"}
    rest = {k: v for k, v in overrides.items() if k != "train"}
    return {**rest, "train": train} if train else rest


def base_label(label: str) -> str:
    """A row's label less its ``train.budget_x=...`` override: one line per variant across budgets."""
    text = re.sub(r"train\.budget_x=[^,\]]*(, )?", "", label)
    return text.replace(", ]", "]").replace(" []", "")


def split_budget(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(equal-steps rows, matched-compute rows)`` of a quality DataFrame, by ``budget_x``."""
    if "budget_x" not in df:
        return df, df.iloc[0:0]
    marked = pd.to_numeric(df["budget_x"], errors="coerce").notna()
    return df[~marked], df[marked]


def _numeric(df: pd.DataFrame) -> pd.DataFrame:
    """Budget rows with numeric columns and the label less the budget."""
    return df.assign(label=df["label"].map(base_label),
                     **{c: pd.to_numeric(df[c], errors="coerce")
                        for c in (*BUDGET_COLUMNS, "steps", "value")})


def seed_cell(values: pd.Series, metric: str) -> str:
    """A table cell of ``values`` over seeds: the value, or mean ± std, in ``metric``'s display unit."""
    scale, digits = display_unit(metric)
    values = values.dropna() * scale
    if values.empty:
        return "-"
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def budget_table(df: pd.DataFrame) -> str:
    """The markdown section of the budget units' test headline rows: per task and variant the GFLOPs of a step,
    and at each budget the test metric and the steps it bought."""
    if df.empty:
        return ""
    df = _numeric(df)
    multiples = sorted(set(df.budget_x))
    rows = []
    for task in order_tasks(df.task):
        part = df[df.task == task]
        metric = part.metric.iloc[0]
        for name in sorted(set(part.label)):
            mine = part[part.label == name]
            row = {"task": task, "variant": name, "metric": metric,
                   "GFLOPs/step": f"{mine.flops_per_step.median() / 1e9:.4g}"}
            for x in multiples:
                at = mine[mine.budget_x == x]
                steps = "" if at.empty else f" ({int(at.steps.median())} steps)"
                row[f"{x:g}x"] = seed_cell(at.value, metric) + steps
            rows.append(row)
    budgets = ", ".join(f"{x:g}x" for x in multiples)
    return "\n".join([
        "## Quality at matched compute (test; accuracy in %)", "",
        f"Each variant trained for the same training FLOPs ({budgets} of what full attention "
        "spends in the preset's steps; steps = floor(budget / FLOPs per step), warm-up and "
        "validation interval stretched with them). FLOPs are counted from shapes, not timed "
        "(docs/quality.md).", "", markdown_table(pd.DataFrame(rows)), ""])


def plot_budget(df: pd.DataFrame, run_dir: Path) -> list[Path]:
    """``budget.png`` and ``.svg``: test quality against training FLOPs, a panel per task."""
    df = _numeric(df)
    tasks = order_tasks(df.task)
    colours = dict(zip(sorted(set(df.label)), pyplot().get_cmap("tab10").colors))
    fig, axes = figure_panels(len(tasks), 4.2, 3.6)
    for ax, task in zip(axes.flat, tasks):
        part = df[df.task == task]
        metric = part.metric.iloc[0]
        for name, mine in part.groupby("label"):
            points = mine.groupby("budget_x").agg(flops=("train_flops", "median"),
                                                  quality=("value", "mean"),
                                                  spread=("value", "std")).sort_values("flops")
            ax.errorbar(points.flops, points.quality, yerr=points.spread.fillna(0), fmt="o-",
                        color=colours[name], label=name, capsize=3)
        ax.set_xscale("log")
        ax.set_title(task)
        ax.set_xlabel("training FLOPs")
        ax.set_ylabel(metric.replace("_", " "))
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(f"{Path(run_dir).name}: quality at matched training FLOPs")
    fig.tight_layout()
    return save_figure(fig, Path(run_dir), BUDGET_FIGURE)


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing off screen in the quality figures' theme."""
    import matplotlib  # plotting stack: heavy, imported only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plotting stack
    import seaborn as sns  # plotting stack

    sns.set_theme(style="whitegrid", context="paper")
    return plt


def figure_panels(count: int, width: float, height: float) -> tuple[Any, Any]:
    """A figure of ``count`` panels of ``width`` x ``height`` inches, four a row, the spare ones hidden."""
    cols = min(4, count)
    rows = -(-count // cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    return fig, axes


def save_figure(fig: Any, run_dir: Path, stem: str) -> list[Path]:
    """``fig`` as ``<stem>.png`` and ``.svg`` in ``run_dir``, then closed."""
    paths = [run_dir / f"{stem}.png", run_dir / f"{stem}.svg"]
    for path in paths:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    pyplot().close(fig)
    return paths
