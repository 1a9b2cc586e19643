"""Markdown tables for the reports of every product: numbers shown short, missing ones as ``-``."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def cell(value: Any) -> str:
    """A value as a table shows it: ``-`` when missing, integers whole, others to 3 digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table of ``df`` (index ignored)."""
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])
