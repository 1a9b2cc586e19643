"""Driving chains of units through an executor.

A *chain* is a generator of units: it yields a unit, receives the unit's rows (``send``) and
decides what to yield next, so dependencies between units (a curve that failed at one length
skips its larger lengths, for that pass only) live in the chain. :func:`drive` keeps the
executor's slots busy with the next units of the chains and hands every unit's rows to
``on_done`` as soon as they arrive; the driver process alone writes results.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from bench.engine.executors import Executor
from bench.speed.cases import Case
from bench.speed.rounds import CaseRun, SpeedUnit, failure_rows

Rows = list[dict[str, Any]]
Chain = Generator[Any, Rows, None]
#: statuses after which larger lengths of the same curve and pass are skipped
FATAL = ("timeout", "oom")


def drive(chains: list[Chain], executor: Executor, *,
          on_start: Callable[[Any], None] | None = None,
          on_done: Callable[[Any, Rows], None] | None = None) -> None:
    """Run every unit of every chain, at most ``executor.slots`` at once."""
    waiting: deque[Chain] = deque(chains)
    running: dict[str, Chain] = {}

    def start(chain: Chain, unit: Any) -> None:
        running[unit.unit_id] = chain
        if on_start is not None:
            on_start(unit)
        executor.submit(unit)

    while waiting or running:
        while waiting and len(running) < executor.slots:
            chain = waiting.popleft()
            unit = next(chain, None)
            if unit is not None:
                start(chain, unit)
        if not running:
            continue
        unit, rows = executor.wait_any()
        chain = running.pop(unit.unit_id)
        if on_done is not None:
            on_done(unit, rows)
        try:
            follow = chain.send(rows)
        except StopIteration:
            continue
        start(chain, follow)  # the freed slot goes to the same chain: its units stay together


def speed_chain(groups: list[list[Case]], done: set[tuple[str, str]],
                failures: dict[tuple[Any, str], tuple[int, str]], skip_larger: bool) -> Chain:
    """Units of one chain of same-length groups (increasing length).

    ``done``: (case_id, pass) already recorded. ``failures``: (curve, pass) -> (smallest
    failing length, status), updated from each unit's rows; with ``skip_larger`` the passes
    of a curve longer than its failure are recorded as ``skipped`` without running.
    """
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
        rows = yield SpeedUnit(tuple(runs), tuple(skipped))
        by_id = {case.case_id: case for case in group}
        for row in rows:
            case = by_id.get(row["case_id"])
            if case is not None and row["status"] in FATAL:
                record_failure(failures, case, row["pass"], row["status"])


def record_failure(failures: dict[tuple[Any, str], tuple[int, str]], case: Case, pass_name: str,
                   status: str) -> None:
    """Remember the smallest length at which a curve's pass failed."""
    key = (case.group, pass_name)
    if key not in failures or case.seq_len < failures[key][0]:
        failures[key] = (case.seq_len, status)
