"""A decoding benchmark's ``results.csv`` (a ``benchmark`` column), told apart from a speed sweep's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RESULTS_FILE = "results.csv"
SUMMARY_FILE = "summary.md"


def is_decoding_run(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds ``attn-bench decoding``'s results (its header starts with ``benchmark``)."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        return False
    with path.open(encoding="utf-8") as file:
        return file.readline().split(",", 1)[0].strip() == "benchmark"


def load_decoding(run_dir: str | Path) -> pd.DataFrame:
    """A decoding run's rows (``benchmark`` is ``decoding`` or ``streaming``)."""
    if not is_decoding_run(run_dir):
        raise ValueError(f"RUN_DIR {run_dir}: not a decoding run (no {RESULTS_FILE} whose first "
                         "column is benchmark); give a directory written by attn-bench decoding")
    return pd.read_csv(Path(run_dir) / RESULTS_FILE)
