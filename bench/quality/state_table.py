"""Recall against state (docs/quality.md, "Recall against state"): per recall task, model width and pattern, the
test accuracy beside the bytes one layer keeps to answer; the figure's points and the report's section. Every
function reads ``top``, the grid's headline test rows (:func:`bench.quality.tables.headline`)."""

from __future__ import annotations

import json

import pandas as pd

from bench.engine.labels import overrides_text, variant_label
from bench.engine.markdown import markdown_table
from bench.quality.budget import seed_cell
from bench.quality.reference_unit import reference_row_mask
from bench.quality.settings import MODEL_SIZE
from bench.quality.state import STATE_TASKS
from bench.quality.tables import task_order, uniform_chance
from models.config import SIZES

#: the figure's file stem (``recall_state.png`` and ``.svg``)
FIGURE = "recall_state"
#: model settings that set a width: a panel's, not part of a pattern's name
WIDTH_KEYS = ("d_model", "d_ff")
#: the columns of :func:`state_points`
POINT_COLUMNS = ["task", "width", "recipe", "label", "role", "rule", "state_bytes", "mean", "std", "seeds",
                 "cell"]


def _width(settings: str) -> int:
    """The model width (``d_model``) a row was trained at, from its recorded settings."""
    model = json.loads(settings or "{}").get("model", {})
    return int(model.get("d_model", SIZES[MODEL_SIZE]["d_model"]))


def _recipe(overrides: str) -> str:
    """The row's training overrides (``train.lr=0.001``; empty: the preset's): part of the panel, with the width."""
    return overrides_text({"train": json.loads(overrides or "{}").get("train") or {}})


def panel_title(width: int, recipe: str) -> str:
    """``d_model=128`` or ``d_model=128, train.lr=0.001``: one panel of the figure, one column pair of the table."""
    return f"d_model={width}" + (f", {recipe}" if recipe else "")


def _pattern(row: pd.Series) -> str:
    """The row's label less the width settings and training overrides (the panel)."""
    overrides = json.loads(row.overrides or "{}")
    model = {k: v for k, v in (overrides.get("model") or {}).items() if k not in WIDTH_KEYS}
    rest = {k: v for k, v in overrides.items() if k not in ("model", "train")}
    rest = {**rest, "model": model} if model else rest
    try:
        return variant_label(row.variant, json.loads(row.params or "{}"), rest)
    except (ValueError, TypeError):
        return str(row.label)


def state_rows(top: pd.DataFrame) -> pd.DataFrame:
    """The trained accuracy rows of the recall tasks (computed references left out: no layers)."""
    return top[top.task.isin(list(STATE_TASKS)) & (top.metric == "accuracy") & ~reference_row_mask(top)]


def skip_reason(top: pd.DataFrame) -> str | None:
    """Why the grid has no figure of recall against state (``None``: it has one)."""
    rows = state_rows(top)
    if rows.empty:
        return (f"no finished {' or '.join(STATE_TASKS)} training run in this grid, so no figure of "
                "recall against state")
    if rows.state_bytes.isna().all():
        return ("its recall rows carry no state_bytes (written before the column existed), so no "
                "figure of recall against state")
    return None


def state_points(top: pd.DataFrame) -> pd.DataFrame:
    """Per (task, width, recipe, pattern): the state bytes, how they were counted, test accuracy mean and std over seeds
    (``cell``: as the report writes it, in %)."""
    rows = state_rows(top)
    rows = rows[rows.state_bytes.notna()]
    if rows.empty:
        return pd.DataFrame(columns=POINT_COLUMNS)
    rows = rows.assign(width=rows.settings.map(_width), recipe=rows.overrides.map(_recipe),
                       pattern=rows.apply(_pattern, axis=1),
                       rule=rows.state_rule.fillna("").astype(str).str.split(":").str[0])
    grouped = rows.groupby(["task", "width", "recipe", "pattern"], sort=False).agg(
        role=("role", "first"), rule=("rule", "first"), state_bytes=("state_bytes", "median"),
        mean=("value", "mean"), std=("value", "std"), seeds=("seed", "nunique"),
        cell=("value", lambda v: seed_cell(v, "accuracy")))
    points = grouped.reset_index().rename(columns={"pattern": "label"})
    order = {t: i for i, t in enumerate(task_order(points))}
    points = points.sort_values(["task", "width", "recipe", "state_bytes", "label"],
                                key=lambda s: s.map(order) if s.name == "task" else s)
    return points[POINT_COLUMNS].reset_index(drop=True)


def panels_of(points: pd.DataFrame) -> list[tuple[int, str]]:
    """The ``(width, recipe)`` panels of :func:`state_points`, narrowest first, the preset's recipe first."""
    return sorted(set(zip(points.width, points.recipe)))


def reference_floors(top: pd.DataFrame) -> pd.DataFrame:
    """Per recall task, each computed reference's test accuracy (mean) and uniform chance: ``task, label, value``."""
    refs = top[top.task.isin(list(STATE_TASKS)) & (top.metric == "accuracy") & reference_row_mask(top)]
    rows = [{"task": t, "label": name, "value": float(part.value.mean())}
            for (t, name), part in refs.groupby(["task", "label"], sort=True)]
    rows += [{"task": t, "label": "uniform chance", "value": level}
             for t, level in uniform_chance(top).items() if t in STATE_TASKS]
    return pd.DataFrame(rows, columns=["task", "label", "value"])


def state_table(top: pd.DataFrame) -> pd.DataFrame:
    """Task x pattern: how the state was counted and, per panel (width and recipe), its bytes and the test accuracy
    over seeds; each task's floors after its patterns."""
    points, floors = state_points(top), reference_floors(top)
    panels = panels_of(points)
    rows = []
    for task in task_order(points):
        for name, part in points[points.task == task].groupby("label", sort=False):
            role = part.role.iloc[0]
            row = {"task": task, "variant": name if role == "variant" else f"{name} ({role})",
                   "rule": part.rule.iloc[0]}
            for width, recipe in panels:
                here = part[(part.width == width) & (part.recipe == recipe)]
                title = panel_title(width, recipe)
                row[f"state ({title})"] = f"{int(here.state_bytes.iloc[0]):,} B" if len(here) else "-"
                row[f"accuracy % ({title})"] = here.cell.iloc[0] if len(here) else "-"
            rows.append(row)
        for floor in floors[floors.task == task].itertuples():
            rows.append({"task": task, "variant": f"{floor.label} (floor)", "rule": "none",
                         **{f"{what} ({panel_title(*panel)})": "-" if what == "state" else f"{floor.value * 100:.1f}"
                            for panel in panels for what in ("state", "accuracy %")}})
    return pd.DataFrame(rows)


def state_section(top: pd.DataFrame) -> list[str]:
    """The report's section: the table and a link to the figure, or one line saying why there is none."""
    title = "## Recall against state"
    if not top.task.isin(STATE_TASKS).any():  # a grid without recall tasks: nothing to say
        return []
    reason = skip_reason(top)
    if reason is not None:
        return [title, "", f"No figure: {reason}.", ""]
    return [title, "",
            "Per recall task and model width (`d_model`, with the training settings an entry changes, "
            "if any), each trained model's test accuracy (mean ± "
            "std over seeds, in %) beside the bytes one layer keeps per sequence to answer at the "
            "task's length (`state_bytes`, measured on the layer's own decoding cache: an attention "
            "pattern's KV cache, all N keys or a band's g + r·w + 1, a recurrent mixer's decoding "
            "state, an LSTM's h and c; `rule` says which; docs/quality.md, \"Recall against "
            "state\"). Zoology (Arora et al. 2023) found recall decided by this size. Read it beside "
            "the floors below (uniform chance and the references without attention): a point at "
            f"them has not learned the recall. Figure: [{FIGURE}.png]({FIGURE}.png) "
            f"([svg]({FIGURE}.svg)).", "",
            markdown_table(state_table(top)), ""]
