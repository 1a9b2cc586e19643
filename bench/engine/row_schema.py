"""What a row of a results file may hold: its columns in file order and each column's rule, in one place.

A file's first column picks its schema (:data:`SCHEMAS`); :func:`row_problem` names the first thing
wrong with a row. Columns a schema does not declare are left alone; a blank (or ``nan``) cell stays
legal wherever a failure row leaves it blank. Plain dataclasses, not a validation library: the rules
are few and the messages must name column and line as the suite's other checks do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.engine.config import DEVICES, DTYPES
from bench.engine.messages import shown
from bench.engine.provenance import ROW_FIELDS

#: the columns of a speed sweep's ``results.csv``, in file order (one row per case and pass)
COLUMNS = [
    "case_id", "label", "variant", "kernel_requested", "kernel", "kernel_path", "params",
    "seq_len", "batch", "heads", "head_dim", "dtype", "device", "causal", "pass", "status",
    "reason", "time_ms", "time_iqr_ms", "repeats", "times_ms", "estimate_ms", "first_call_ms",
    "compile_ms", "setup_ms", "setup_mem_bytes", "peak_mem_bytes", "rss_peak_bytes", "flops",
    "flops_kind", "density", "tflops", "peak_fraction", "mask_emulated", "fallback",
    "interleave_id", "interleaved", "threads", *ROW_FIELDS,
    # added later; older files read as: judged by spread, unpacked, kv_heads = heads, not measured,
    # probes compared only with each other, auto's source unknown (blank)
    "time_spread", "probe_ms", "noisy", "noise_threshold", "packing", "kv_heads", "compile_bwd_ms",
    "probe_size", "auto_source",
]
#: the matched-compute columns of a training row (``budget_x`` empty: an equal-steps run)
BUDGET_COLUMNS = ("budget_x", "flop_budget", "flops_per_step", "train_flops")
#: the columns of a training grid's ``quality.csv`` (and ``superseded.csv``), in file order
QUALITY_COLUMNS = [
    "unit_id", "task", "variant", "label", "params", "seed", "preset", "split", "metric",
    "condition", "value", "status", "reason", "steps", "best_step", "train_time_s",
    "train_tokens_per_s", "eval_tokens_per_s", "peak_mem_bytes", "param_count", "seq_len",
    "model_kind", "attention_parts", "kernel_path", "settings", "threads", *ROW_FIELDS,
    "role", "title", "overrides",  # added later: files without them read as a variant, no overrides
    *BUDGET_COLUMNS,
    "state_bytes", "state_rule",  # recall tasks (bench/quality/state.py); older files: not counted
]
#: the columns of ``pretrained.csv``: one row per (unit, document, length, depth, positions, metric)
PRETRAINED_COLUMNS = [
    "cell_id", "task", "label", "variant", "params", "layers", "kernel_path", "document",
    "seq_len", "depth", "positions", "metric", "value", "ci_low", "ci_high", "count", "status",
    "reason", "time_ms", "time_iqr_ms", "times_ms", "repeats", "peak_mem_bytes", "kv_cache_bytes",
    "model", "threads", *ROW_FIELDS,
]
#: statuses of a pretrained-model run's rows
PRETRAINED_STATUSES = ("ok", "unsupported", "timeout", "error", "killed", "oom")
#: kinds of column (``nan`` and ``inf`` read as numbers; ``choice``: one of ``allowed``; ``prefix``: starts with one)
KINDS = ("text", "int", "number", "bool", "json", "choice", "prefix")

#: the passes a speed row may name (``PASSES`` and ``MODEL_PASSES`` of bench.speed.config)
SPEED_PASSES = ("fwd", "bwd", "fwd_bwd", "train_step")
#: statuses of a speed sweep's rows (``nonfinite``: the output or a gradient had NaN or inf)
SPEED_STATUSES = ("ok", "oom", "killed", "unsupported", "timeout", "error", "skipped", "nonfinite",
                  "compile_timeout")
#: statuses of a training grid's rows (``diverged``: the training loss became NaN or inf)
QUALITY_STATUSES = ("ok", "unsupported", "timeout", "error", "killed", "oom", "diverged")


@dataclass(frozen=True)
class Column:
    """The rule of one column."""

    name: str
    kind: str = "text"
    required: bool = False  # a blank cell is refused
    minimum: float | None = None  # int, number: the smallest value allowed
    allowed: tuple[str, ...] = ()  # choice: the allowed values; prefix: the allowed beginnings

    def problem(self, text: str) -> str | None:
        """What is wrong with ``text`` in this column (``None``: nothing)."""
        if text == "":
            return "must not be blank" if self.required else None
        if self.kind == "text":
            return None
        if self.kind == "choice":
            if text not in self.allowed:
                return f"unknown value {shown(text)}; allowed values are {list(self.allowed)}"
            return None
        if self.kind == "prefix":
            ok = text.startswith(self.allowed)
            return None if ok else f"must start with one of {list(self.allowed)}; got {shown(text)}"
        if self.kind == "bool":
            return None if text in ("True", "False") else f"must be True or False; got {shown(text)}"
        if self.kind == "json":
            try:
                json.loads(text)
            except ValueError:
                return f"must be JSON; got {shown(text)}"
            return None
        return self._number_problem(text)

    def _number_problem(self, text: str) -> str | None:
        what = "an integer" if self.kind == "int" else "a number"
        try:
            value = float(text)
        except ValueError:
            return f"must be {what}; got {shown(text)}"
        if math.isnan(value):  # a missing value as pandas writes it: as legal as a blank
            return f"must be {what}, not NaN" if self.required else None
        if self.kind == "int" and not (math.isfinite(value) and value == int(value)):
            return f"must be {what}; got {shown(text)}"
        if self.minimum is not None and not math.isnan(value) and value < self.minimum:
            return f"must be {what} >= {self.minimum:g}; got {shown(text)}"
        return None


Row = dict[str, str]


@dataclass(frozen=True)
class RowSchema:
    """The columns of one kind of results file and the rules of its rows."""

    name: str  # what the file is, for messages ("speed sweep results")
    columns: tuple[Column, ...]
    #: columns the header must have (a file without them is damaged, not old)
    header: tuple[str, ...]
    #: rows sharing these columns' values stand or fall together (they are run together)
    unit: tuple[str, ...]
    #: the rule of a whole row: what is wrong with it (``None``: nothing)
    row_rule: Callable[[Row], str | None] | None = None

    def column(self, name: str) -> Column | None:
        """The rule of column ``name`` (``None``: not declared here, left alone)."""
        return next((c for c in self.columns if c.name == name), None)


def row_problem(row: Row, schema: RowSchema) -> str | None:
    """The first thing wrong with ``row`` under ``schema`` (``None``: nothing)."""
    for column in schema.columns:
        if column.name not in row:
            continue  # an older file without the column: blank, as it always read
        problem = column.problem(row[column.name])
        if problem is not None:
            return f"column {column.name!r}: {problem}"
    return schema.row_rule(row) if schema.row_rule is not None else None


def missing_columns(header: list[str], schema: RowSchema) -> list[str]:
    """The columns ``schema`` needs that ``header`` lacks."""
    return [c for c in schema.header if c not in header]


def _finite_time(row: Row) -> str | None:
    """An ``ok`` speed row must carry its time: a finite number > 0."""
    if row.get("status") != "ok":
        return None
    text = row.get("time_ms", "")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        return f"column 'time_ms': an ok row must have a finite time > 0; got {shown(text)}"
    return None


def _metric_value(row: Row) -> str | None:
    """An ``ok`` metric row must carry its value (NaN is one: an empty bucket has no accuracy)."""
    if row.get("status") != "ok" or row.get("metric", "") in ("", "-"):
        return None
    if row.get("value", "") == "":
        return "column 'value': an ok row of a metric must have a value; got ''"
    return None


def _numbers(names: tuple[str, ...], kind: str = "number", minimum: float | None = 0) -> tuple[Column, ...]:
    return tuple(Column(name, kind, minimum=minimum) for name in names)


SPEED = RowSchema(
    name="speed sweep results",
    columns=(
        Column("case_id", required=True),
        Column("label", required=True),
        Column("variant", required=True),
        Column("kernel_requested", required=True),
        Column("params", "json"),
        Column("seq_len", "int", required=True, minimum=1),
        *_numbers(("batch", "heads", "head_dim", "kv_heads"), "int", 1),
        Column("dtype", "choice", allowed=DTYPES),
        Column("device", "choice", allowed=DEVICES),
        Column("causal", "bool"),
        Column("pass", "choice", required=True, allowed=SPEED_PASSES),
        Column("status", "choice", required=True, allowed=SPEED_STATUSES),
        *_numbers(("time_ms", "time_iqr_ms", "estimate_ms", "first_call_ms", "compile_ms",
                   "compile_bwd_ms", "setup_ms", "setup_mem_bytes", "peak_mem_bytes", "rss_peak_bytes", "flops",
                   "density", "tflops", "peak_fraction", "time_spread", "noise_threshold")),
        Column("repeats", "int", minimum=1),
        Column("times_ms", "json"),
        Column("probe_ms", "json"),
        Column("noisy", "bool"),
        Column("mask_emulated", "bool"),
        Column("interleaved", "int", minimum=1),
        Column("threads", "int", minimum=1),
        Column("probe_size", "int", minimum=1),
        # where auto's order came from (docs/kernels.md): default[: why a tuning file was ignored] or tuned:<sha>
        Column("auto_source", "prefix", allowed=("default", "tuned:")),
        Column("timestamp", required=True),
    ),
    header=("case_id", "label", "variant", "kernel_requested", "seq_len", "pass", "status",
            "time_ms", "timestamp"),
    unit=("case_id", "pass"),
    row_rule=_finite_time,
)

QUALITY = RowSchema(
    name="training grid results",
    columns=(
        Column("unit_id", required=True),
        Column("params", "json"),
        Column("seed", "int", minimum=0),
        Column("value", "number", minimum=None),
        Column("status", "choice", required=True, allowed=QUALITY_STATUSES),
        *_numbers(("steps", "best_step", "param_count", "state_bytes"), "int", 0),
        *_numbers(("train_time_s", "train_tokens_per_s", "eval_tokens_per_s", "peak_mem_bytes",
                   "budget_x", "flop_budget", "flops_per_step", "train_flops")),
        Column("seq_len", "int", minimum=1),
        Column("settings", "json"),
        Column("overrides", "json"),
        Column("threads", "int", minimum=1),
        Column("timestamp", required=True),
    ),
    header=("unit_id", "split", "metric", "status", "value", "timestamp"),
    unit=("unit_id",),
    row_rule=_metric_value,
)

PRETRAINED = RowSchema(
    name="pretrained-model results",
    columns=(
        Column("cell_id", required=True),
        Column("task", required=True),
        Column("params", "json"),
        Column("layers", "json"),
        Column("seq_len", "int", minimum=1),
        Column("depth", "number"),
        Column("value", "number", minimum=None),
        *_numbers(("ci_low", "ci_high", "time_ms", "time_iqr_ms", "peak_mem_bytes",
                   "kv_cache_bytes")),
        *_numbers(("count", "repeats"), "int", 0),
        Column("times_ms", "json"),
        Column("status", "choice", required=True, allowed=PRETRAINED_STATUSES),
        Column("threads", "int", minimum=1),
        Column("timestamp", required=True),
    ),
    header=("cell_id", "task", "metric", "status", "value", "timestamp"),
    unit=("cell_id",),
    row_rule=_metric_value,
)

#: the schema of a file, by the first column of its header
SCHEMAS: dict[str, RowSchema] = {"case_id": SPEED, "unit_id": QUALITY, "cell_id": PRETRAINED}


def schema_for(columns: list[str] | tuple[str, ...]) -> RowSchema:
    """The schema of a file whose columns are ``columns`` (``ValueError`` for another kind)."""
    if not columns or columns[0] not in SCHEMAS:
        first = columns[0] if columns else None
        raise ValueError(f"columns: a results file starts with one of {sorted(SCHEMAS)}; got "
                         f"{shown(first)}")
    return SCHEMAS[columns[0]]


def unit_of(row: dict[str, Any], schema: RowSchema) -> tuple[str, ...] | None:
    """The unit a row belongs to (``None`` when its unit columns are blank or missing)."""
    values = tuple(str(row.get(c) or "") for c in schema.unit)
    return values if all(values) else None
