"""The unit of a speed sweep (plain, picklable data an executor runs), and the chains that yield its units."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from bench.engine.rundir import Chain
from bench.speed.cases import Case
from bench.speed.peak import PeakSpec, add_node_peak
from bench.speed.rounds import CaseRun, run_rounds
from bench.speed.rows import failure_rows

#: statuses after which larger lengths of the same curve and pass are skipped
FATAL = ("timeout", "oom")


@dataclass(frozen=True)
class SpeedUnit:
    """Cases at one length timed together in interleaved rounds, plus rows skipped without running."""

    runs: tuple[CaseRun, ...]
    skipped: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    #: the matmul peak to divide by, taken where the unit runs (None: no ``peak_fraction``)
    peak: PeakSpec | None = field(default=None, compare=False)

    @property
    def unit_id(self) -> str:
        """Stable id of the unit (rows timed together share it)."""
        ids = sorted([r.case.case_id for r in self.runs]
                     + [f"{row['case_id']}/{row['pass']}" for row in self.skipped])
        return hashlib.sha1(",".join(ids).encode()).hexdigest()[:12]

    @property
    def device(self) -> str:
        """The device its cases run on."""
        return self.runs[0].case.device if self.runs else str(self.skipped[0]["device"])

    def describe(self) -> str:
        """One-line description for progress bars."""
        first = (self.runs[0].case if self.runs else None)
        if first is None:
            return f"{len(self.skipped)} skipped row(s)"
        kernels = "/".join(dict.fromkeys(
            r.case.kernel + (f" H_kv={r.case.key_heads}" if r.case.key_heads != r.case.heads else "")
            for r in self.runs))
        passes = "/".join(dict.fromkeys(p for r in self.runs for p in r.passes))
        return (f"{first.label} [{kernels}] N={first.seq_len} B={first.batch} H={first.heads} "
                f"D={first.head_dim} {first.dtype}{' causal' if first.causal else ''} {passes}")

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]:
        """Measure the runs, add each ok row's share of this device's matmul peak, and the skipped rows."""
        if not self.runs:
            return list(self.skipped)
        rows = run_rounds(self.runs, self.unit_id, cuda_visible)
        if self.peak is not None:
            rows = add_node_peak(rows, self.peak, cuda_visible)
        return [*rows, *self.skipped]

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        """A row per (case, pass) of the runs, all with this status (and the skipped rows)."""
        return [*(row for r in self.runs for row in failure_rows(r.case, r.passes, status, reason)), *self.skipped]


def run_case(case: Case, cuda_visible: str | None = None) -> list[dict[str, Any]]:
    """Measure one case alone (every pass), here; one row per pass."""
    return SpeedUnit((CaseRun(case, case.passes),)).run(cuda_visible)


def speed_chain(groups: list[list[Case]], done: set[tuple[str, str]],
                failures: dict[tuple[Any, str], tuple[int, str]], skip_larger: bool,
                peak: PeakSpec | None = None) -> Chain:
    """Units of a chain of same-length groups, less ``done``; ``skip_larger``: lengths past ``failures`` skipped."""
    for group in groups:
        runs, skipped = [], []
        for case in group:
            passes = []
            for pass_name in case.passes:
                if (case.case_id, pass_name) in done:
                    continue
                failed = failures.get((case.group, pass_name))
                if skip_larger and failed and failed[0] < case.seq_len:
                    reason = f"skipped: N={failed[0]} already hit {failed[1]} in pass {pass_name}"
                    skipped += failure_rows(case, [pass_name], "skipped", reason)
                else:
                    passes.append(pass_name)
            if passes:
                runs.append(CaseRun(case, tuple(passes)))
        if not runs and not skipped:
            continue
        rows = yield SpeedUnit(tuple(runs), tuple(skipped), peak)
        record_failures(failures, {case.case_id: case for case in group}, rows)


def record_failures(failures: dict[tuple[Any, str], tuple[int, str]], cases: dict[str, Case],
                    rows: list[dict[str, Any]]) -> None:
    """Remember the smallest length at which each curve's pass hit a :data:`FATAL` status in ``rows``."""
    for row in rows:
        case = cases.get(row["case_id"])
        if case is None or row["status"] not in FATAL:
            continue
        key = (case.group, row["pass"])
        if key not in failures or case.seq_len < failures[key][0]:
            failures[key] = (case.seq_len, row["status"])
