"""The driver's side of a run directory: :func:`run_units` drives a plan's chains of units, and its dry run."""

from __future__ import annotations

import csv
import io
import os
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.engine.config import check_device, import_plugins
from bench.engine.executors import Executor, ExecutorSpec, LocalExecutor
from bench.engine.fsutil import RunLock, atomic_write_json, require_writable
from bench.engine.provenance import environment
from bench.engine.results import (
    REJECTED_SUFFIX,
    RETRY_STATUSES,
    ResultsWriter,
    RowsRead,
    read_env,
    read_table,
    warn_rejected,
    write_env,
)
from bench.engine.resume_check import SETTING_FIELDS, MixedEnvironmentError, check_resume  # noqa: F401  (the error: re-exported)
from bench.engine.row_schema import schema_for, unit_of

Row = dict[str, Any]
Rows = list[Row]
#: a generator of units: it yields a unit and is sent that unit's rows
Chain = Generator[Any, Rows, None]


class RunRecorder:
    """Kept rows, environment segments and the results writer of one run directory."""

    def __init__(self, run_dir: Path, *, file: str, columns: list[str],
                 key: Callable[[Row], tuple], overwrite: bool = False,
                 retry_failed: bool = False, redo: Callable[[Row], bool] | None = None) -> None:
        self.run_dir, self.file, self.columns = Path(run_dir), file, columns
        self.overwrite = overwrite
        #: damaged lines (and the other rows of their units), kept in <file>.rejected at start
        self._rejected: list[tuple[RowsRead, list[Row]]] = []
        existing: list[Row] = []
        if not overwrite:
            read = read_table(self.run_dir, file, columns)
            warn_rejected(read, "run again (the line is kept in "
                                f"{file}{REJECTED_SUFFIX})")
            existing, unit_rows = _without_damaged_units(read, columns)
            self._rejected.append((read, unit_rows))
        seen: set[tuple] = set()
        self.kept: list[Row] = []
        for row in existing:
            k = key(row)
            if (k in seen or (retry_failed and row["status"] in RETRY_STATUSES)
                    or (redo is not None and redo(row))):
                continue
            seen.add(k)
            self.kept.append(row)
        self.writer: ResultsWriter | None = None
        self.env: dict[str, Any] = {}

    def supersede(self, stale: Callable[[Row], bool], archive: str) -> None:
        """Move the kept rows where ``stale(row)`` holds to ``archive`` (they run again). Before :meth:`start`."""
        dropped = [row for row in self.kept if stale(row)]
        if dropped:
            self.kept = [row for row in self.kept if not stale(row)]
            # rewritten whole: an archive written before a column was added keeps its rows
            earlier = read_table(self.run_dir, archive, self.columns)
            warn_rejected(earlier, f"left out (the line is kept in {archive}{REJECTED_SUFFIX})")
            _keep_rejected(earlier, [])
            ResultsWriter(self.run_dir, [*earlier.rows, *dropped], archive, self.columns)

    def start(self, env: dict[str, Any], *, dtype: str, allow_mixed: bool, has_work: bool,
              config: dict[str, Any], config_file: str, local: bool = True) -> None:
        """Check the environment (:func:`check_resume`), rewrite the kept rows, record this segment."""
        if not allow_mixed:
            check_resume(self.kept, env, dtype, has_work=has_work, local=local)
        for read, unit_rows in self._rejected:
            _keep_rejected(read, unit_rows)
        self._rejected = []
        self.writer = ResultsWriter(self.run_dir, self.kept, self.file, self.columns)
        self.env = env
        if has_work:
            segments = [] if self.overwrite else read_env(self.run_dir)
            write_env(self.run_dir, [*segments, env])
            atomic_write_json(self.run_dir / config_file, config)

    def record(self, rows: list[Row]) -> None:
        """Append ``rows``, filling this segment's :data:`SETTING_FIELDS` (the resume check compares them)."""
        assert self.writer is not None, "start() first"
        for row in rows:
            for name in SETTING_FIELDS:
                if name in self.env:
                    row.setdefault(name, self.env[name])
        self.writer.append(rows)


def resumable_rows(run_dir: Path, file: str, columns: list[str]) -> list[Row]:
    """The rows a resume keeps (before ``--retry-failed``), warning of each damaged line."""
    read = read_table(run_dir, file, columns)
    warn_rejected(read, "run again")
    return _without_damaged_units(read, columns)[0]


def _without_damaged_units(read: RowsRead, columns: list[str]) -> tuple[list[Row], list[Row]]:
    """The valid rows of units without a damaged row, and the others (a unit runs whole)."""
    schema = schema_for(columns)
    damaged = {unit_of(bad.row, schema) for bad in read.rejected if bad.row}
    damaged.discard(None)
    return ([row for row in read.rows if unit_of(row, schema) not in damaged],
            [row for row in read.rows if unit_of(row, schema) in damaged])


def _keep_rejected(read: RowsRead, unit_rows: list[Row]) -> None:
    """Append the damaged lines and the rest of their units to ``<file>.rejected``, fsynced."""
    if not read.rejected:
        return
    path = read.path.with_name(read.path.name + REJECTED_SUFFIX)
    buffer = io.StringIO()
    if not path.exists():
        csv.writer(buffer).writerow(read.header)
    buffer.writelines(bad.text if bad.text.endswith("\n") else bad.text + "\n" for bad in read.rejected)
    csv.DictWriter(buffer, fieldnames=read.header, extrasaction="ignore").writerows(unit_rows)
    with path.open("a", newline="") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())


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


@dataclass(frozen=True)
class DryRunItem:
    """One item of a dry run: its id, ``done``/``todo``/``todo (WHY)``, and a description."""

    key: str
    state: str
    description: str


@dataclass(frozen=True)
class DryRun:
    """What a run into ``run_dir`` would do: every item of the plan with its state."""

    run_dir: Path
    size: str  # how many items, said with their nouns (RunPlan.size)
    items: tuple[DryRunItem, ...]

    @property
    def done(self) -> int:
        return sum(item.state == "done" for item in self.items)

    def lines(self) -> list[str]:
        """One numbered line per item, then ``<size>, D already done in <run_dir>``."""
        return [*(f"{i + 1:4d} {p.key} {p.state} {p.description}" for i, p in enumerate(self.items)),
                f"{self.size}, {self.done} already done in {self.run_dir}"]


def counted(n: int, singular: str, plural: str) -> str:
    """``n`` and the noun in its number: ``1 case``, ``2 cases``."""
    return f"{n} {singular if n == 1 else plural}"


class RunPlan(Protocol):
    """A product's run plan: its units, results file and rows (:func:`run_units`)."""

    file: str  # the results file (results.csv, quality.csv)
    columns: list[str]  # its columns (bench.engine.row_schema)
    device: str  # where the units run (cpu or cuda): checked before anything runs
    threads: int | None  # the configured thread count (None: torch's default)
    dtype: str  # the dtype a resume must share with the rows already there
    row_settings: dict[str, Any]  # run-wide settings every row records and a resume compares (PLAN_SETTINGS)
    config_file: str  # where the resolved config of a segment with work is written (sweep.json)
    plugins: tuple[str, ...]  # modules imported before anything runs (and again in each worker)

    def size(self) -> str: ...  # how many items, with their nouns: 12 cases (counted)

    def dry_run_items(self, kept: Rows, run_dir: Path) -> list[DryRunItem]: ...  # each item's state, given kept rows

    def outcome(self, rows: Rows) -> str: ...  # what a finished unit's rows say, in one line (a progress log)

    def key(self, row: Row) -> tuple: ...  # a row's identity: an earlier row with the same key is kept

    def resolved_config(self) -> dict[str, Any]: ...  # the resolved config written to config_file

    def chains(self, recorder: RunRecorder) -> list[Chain]: ...  # the units still to run ([]: none), before the start

    # called once there is work, before any unit runs: a hook for each row, or None
    def begin(self, run_dir: Path, env: dict[str, Any]) -> Callable[[Row], None] | None: ...


def dry_run_units(run_dir: Path, plan: RunPlan, *, allow_mixed: bool = False,
                  local: bool = True) -> DryRun:
    """What :func:`run_units` would do, nothing run or written; the ``MixedEnvironmentError`` the run would raise."""
    run_dir = Path(run_dir)
    kept = resumable_rows(run_dir, plan.file, plan.columns)
    items = tuple(plan.dry_run_items(kept, run_dir))
    if kept and not allow_mixed:
        check_resume(kept, {**environment(plan.device, plan.threads), **plan.row_settings},
                     plan.dtype, has_work=any(item.state != "done" for item in items),
                     local=local)
    return DryRun(run_dir, plan.size(), items)


def run_units(run_dir: Path, plan: RunPlan, *, executor: Executor | ExecutorSpec | None = None,
              allow_mixed: bool = False, retry_failed: bool = False, overwrite: bool = False,
              redo: Callable[[Row], bool] | None = None,
              on_start: Callable[[Any], None] | None = None,
              on_done: Callable[[Any, Rows], None] | None = None) -> Rows:
    """Run every unit ``plan`` still has into ``run_dir`` (locked, resumable); the new rows."""
    import_plugins(plan.plugins)
    if _runs_here(executor):  # on a cluster each node checks its own device (bench.engine.executors.base)
        check_device(plan.device)
    run_dir = require_writable(run_dir)
    if isinstance(executor, ExecutorSpec):
        executor = executor.make(plan.device)
    executor = executor or LocalExecutor(plan.device)
    local = isinstance(executor, LocalExecutor)
    try:
        with RunLock(run_dir):
            recorder = RunRecorder(run_dir, file=plan.file, columns=plan.columns, key=plan.key,
                                   overwrite=overwrite, retry_failed=retry_failed, redo=redo)
            chains = plan.chains(recorder)
            env = {**environment(plan.device, plan.threads, probe=local), **plan.row_settings}
            recorder.start(env, dtype=plan.dtype, allow_mixed=allow_mixed, has_work=bool(chains),
                           config=plan.resolved_config(), config_file=plan.config_file, local=local)
            if not chains:
                return []
            finish = plan.begin(run_dir, env)
            new_rows: Rows = []

            def done_unit(unit: Any, rows: Rows) -> None:
                if finish is not None:
                    for row in rows:
                        finish(row)
                recorder.record(rows)
                new_rows.extend(rows)
                if on_done is not None:
                    on_done(unit, rows)

            drive(chains, executor, on_start=on_start, on_done=done_unit)
            return new_rows
    finally:
        executor.shutdown()


def _runs_here(executor: Executor | ExecutorSpec | None) -> bool:
    """Whether units run on this machine, so its device is the one to check (not a Ray driver's)."""
    if isinstance(executor, ExecutorSpec):
        return executor.name == "local"
    return executor is None or isinstance(executor, LocalExecutor)
