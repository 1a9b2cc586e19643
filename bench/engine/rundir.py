"""The driver's side of a run directory, for speed sweeps and training grids alike.

:class:`RunRecorder` keeps the whole rows of an earlier run (one per key, first record wins;
with ``retry_failed`` failed, timed-out and skipped ones are dropped to be measured again),
refuses to mix environments on resume unless allowed, records each run segment's
environment in ``env.json`` and appends new rows as units finish. Everything is written
atomically or appended and fsynced; the caller holds the directory's lock.

A damaged row (:func:`bench.engine.results.read_table`) is not kept: its unit runs again (for a
training grid, every row of that unit goes, so the unit trains again), and the damaged
line is appended to ``<file>.rejected`` before the file is rewritten, so nothing read is
lost. A damaged header stops the run before anything is written.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.engine.fsutil import atomic_write_json
from bench.engine.provenance import RESUME_FIELDS
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
from bench.engine.row_schema import schema_for, unit_of

Row = dict[str, Any]


class MixedEnvironmentError(ValueError):
    """Resuming would mix rows measured in different environments."""


def check_resume_environment(rows: list[dict[str, str]], env: dict[str, Any], dtype: str,
                             fields: tuple[str, ...] = RESUME_FIELDS) -> None:
    """``MixedEnvironmentError`` naming what differs between existing rows and this run."""
    current = {**{k: str(env[k]) for k in fields}, "dtype": dtype}
    differences: dict[str, set[str]] = {}
    for row in rows:
        for key, value in current.items():
            if row.get(key) and row[key] != value:
                differences.setdefault(key, set()).add(row[key])
    if differences:
        said = "; ".join(f"{k} {', '.join(sorted(v))} -> {current[k]}" for k, v in differences.items())
        raise MixedEnvironmentError(
            f"the run directory holds rows from another environment ({said}); rerun with "
            "--allow-mixed to add rows anyway (the report then says which rows came from where), "
            "or use another --out")


class RunRecorder:
    """Kept rows, environment segments and the results writer of one run directory."""

    def __init__(self, run_dir: Path, *, file: str, columns: list[str],
                 key: Callable[[Row], tuple], overwrite: bool = False,
                 retry_failed: bool = False) -> None:
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
            if k in seen or (retry_failed and row["status"] in RETRY_STATUSES):
                continue
            seen.add(k)
            self.kept.append(row)
        self.writer: ResultsWriter | None = None
        self.env: dict[str, Any] = {}

    def supersede(self, stale: Callable[[Row], bool], archive: str) -> None:
        """Drop the kept rows for which ``stale(row)`` holds (their units run again) and append
        them to ``archive`` in the run directory, so nothing measured is lost. Before
        :meth:`start`."""
        kept: list[Row] = []
        dropped: list[Row] = []
        for row in self.kept:
            (dropped if stale(row) else kept).append(row)
        if dropped:
            self.kept = kept
            # rewritten whole: an archive written before a column was added keeps its rows
            earlier = read_table(self.run_dir, archive, self.columns)
            warn_rejected(earlier, f"left out (the line is kept in {archive}{REJECTED_SUFFIX})")
            _keep_rejected(earlier, [])
            ResultsWriter(self.run_dir, [*earlier.rows, *dropped], archive, self.columns)

    def start(self, env: dict[str, Any], *, dtype: str, allow_mixed: bool, has_work: bool,
              config: dict[str, Any], config_file: str, local: bool = True) -> None:
        """Check the environment, rewrite the kept rows and record this segment. On a cluster
        (``local`` False) the driver's device and threads say nothing of the nodes', so only
        the code version and the dtype are compared."""
        if has_work and not allow_mixed:
            fields = RESUME_FIELDS if local else ("git_sha",)
            check_resume_environment(self.kept, env, dtype, fields)
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
        """Append ``rows``, which carry the environment of the machine that ran them (the
        executor stamped it, :mod:`bench.engine.executors.base`). A row that does not say its
        thread count ran with this run segment's: the resume check compares it."""
        assert self.writer is not None, "start() first"
        for row in rows:
            row.setdefault("threads", self.env["threads"])
        self.writer.append(rows)


def resumable_rows(run_dir: Path, file: str, columns: list[str]) -> list[Row]:
    """The rows a resume keeps (before ``--retry-failed``): the valid rows of units without
    a damaged row; each damaged line is named in a warning (a dry run's view of
    :class:`RunRecorder`)."""
    read = read_table(run_dir, file, columns)
    warn_rejected(read, "run again")
    return _without_damaged_units(read, columns)[0]


def _without_damaged_units(read: RowsRead, columns: list[str]) -> tuple[list[Row], list[Row]]:
    """The valid rows of ``read`` whose unit has no damaged row, and the others: a unit runs
    whole, so a training run with one damaged row trains again rather than keep half its
    rows."""
    schema = schema_for(columns)
    damaged = {unit_of(bad.row, schema) for bad in read.rejected if bad.row}
    damaged.discard(None)
    kept: list[Row] = []
    dropped: list[Row] = []
    for row in read.rows:
        (dropped if unit_of(row, schema) in damaged else kept).append(row)
    return kept, dropped


def _keep_rejected(read: RowsRead, unit_rows: list[Row]) -> None:
    """Append the damaged lines of ``read`` and the other rows of their units to
    ``<file>.rejected`` (the file's header first when it is new), fsynced, before the file is
    rewritten without them."""
    if not read.rejected:
        return
    path = read.path.with_name(read.path.name + REJECTED_SUFFIX)
    text = "".join(bad.text if bad.text.endswith("\n") else bad.text + "\n" for bad in read.rejected)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    if not path.exists():
        writer.writerow(read.header)
    header_text = buffer.getvalue()
    buffer = io.StringIO()
    csv.DictWriter(buffer, fieldnames=read.header, extrasaction="ignore").writerows(unit_rows)
    with path.open("a", newline="") as f:
        f.write(header_text + text + buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
