"""``attn-bench history``: the runs under the roots gathered into the store, the steps classed, the page written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.engine.provenance import code_version, command_line
from bench.html.history_page import write_history_page
from bench.html.history_steps import newest_regressions, regressions, series_steps
from bench.html.history_store import STORE_FILE, gather
from bench.speed.compare import DEFAULT_ABS_MS, DEFAULT_REL_PCT


@dataclass(frozen=True)
class History:
    """What :func:`build_history` found and wrote."""

    page: Path
    rows: pd.DataFrame  # every history row, with its commit time
    steps: pd.DataFrame  # every step between consecutive commits of a series, classed
    counts: dict[str, int]  # runs found, read again, kept from the store

    @property
    def newest_regressions(self) -> pd.DataFrame:
        """The series whose newest step is a regression (what the gate fails on)."""
        return newest_regressions(self.steps)



def build_history(roots: list[Path], out: Path, rel_pct: float = DEFAULT_REL_PCT,
                  abs_ms: float = DEFAULT_ABS_MS) -> History:
    """Gather every run under ``roots`` into ``out/history.sqlite``, class the steps, write ``out/history.html``."""
    for root in roots:
        if not root.is_dir():
            raise ValueError(f"RESULTS_DIR {root}: no such directory; give folders that hold run "
                             "directories (e.g. results/)")
    out.mkdir(parents=True, exist_ok=True)
    rows, counts = gather(roots, out)
    if rows.empty:
        raise ValueError(f"RESULTS_DIR {' '.join(map(str, roots))}: no run directory with rows found "
                         "(a folder with results.csv or quality.csv)")
    steps = series_steps(rows, rel_pct, abs_ms)
    provenance = {
        "results": " ".join(map(str, roots)),
        "runs": f"{counts['runs']} ({counts['read']} read, {counts['kept']} unchanged in {STORE_FILE})",
        "commits": str(rows.commit_sha.nunique()),
        "machines": "; ".join(sorted(rows.machine.unique())),
        "series": str(rows.groupby(["figure", "case", "machine"]).ngroups),
        "regressions": f"{len(regressions(steps))} step(s), newest step of {len(newest_regressions(steps))} series",
        "written by": f"{command_line()} at code {code_version()}",
    }
    rule = (f"the rule of attn-bench compare: worse by more than {rel_pct:g}%, {abs_ms:g} ms (1 MiB of "
            "memory) and the noise, half of each side's spread")
    return History(page=write_history_page(rows, steps, out, provenance, rule), rows=rows, steps=steps, counts=counts)
