"""A run directory's results file, appended and fsynced per unit, and ``env.json`` (docs/reliability.md)."""

from __future__ import annotations

import csv
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.engine.fsutil import atomic_write_json, atomic_write_text, read_json
from bench.engine.row_schema import COLUMNS, RowSchema, missing_columns, row_problem, schema_for

RESULTS_FILE = "results.csv"
ENV_FILE = "env.json"
#: statuses that ``--retry-failed`` measures (or trains) again
RETRY_STATUSES = ("oom", "killed", "timeout", "error", "skipped", "nonfinite", "diverged")
#: where the lines a resume leaves out are kept: ``results.csv.rejected``
REJECTED_SUFFIX = ".rejected"


class DamagedFileError(ValueError):
    """A results file whose header is damaged: it is left as it is (never rewritten)."""


class DamagedRowWarning(UserWarning):
    """Rows of a results file were left out because they are damaged (line and reason)."""


@dataclass(frozen=True)
class RejectedRow:
    """A line of a results file that is not a valid row."""

    line: int  # where it starts (the header is line 1)
    problem: str
    text: str  # the line(s) as read
    row: dict[str, str] = field(default_factory=dict)  # its cells, when it has the header's length


@dataclass(frozen=True)
class RowsRead:
    """The valid rows of a results file and the lines left out."""

    path: Path
    header: list[str]
    rows: list[dict[str, str]]
    rejected: list[RejectedRow]


def read_table(run_dir: str | Path, file: str = RESULTS_FILE,
               columns: list[str] = COLUMNS) -> RowsRead:
    """Valid rows of a results file and the damaged lines; :class:`DamagedFileError` for a header lacking a column."""
    path = Path(run_dir) / file
    schema = schema_for(columns)
    if not path.exists():
        return RowsRead(path, [], [], [])
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # killed mid-write
    if not any(line.strip() for line in lines):
        return RowsRead(path, [], [], [])  # empty, or only a torn header: nothing to keep
    header = _header(path, lines[0], schema)
    rows: list[dict[str, str]] = []
    rejected: list[RejectedRow] = []
    body = lines[1:]
    reader = csv.reader(body)
    line = 2
    while True:
        try:
            record, problem = next(reader), None
        except StopIteration:
            break
        except csv.Error as err:
            record, problem = [], f"not a CSV row ({err})"
        end = reader.line_num + 1  # the record's last line
        raw = "".join(body[line - 2:end - 1])
        start, line = line, end + 1
        if problem is None and not record:
            continue  # a blank line
        if problem is None and len(record) != len(header):
            problem = f"{len(record)} cells where the header has {len(header)} (a torn or edited line)"
        row = dict(zip(header, record)) if problem is None else {}
        problem = problem or row_problem(row, schema)
        if problem is None:
            rows.append(row)
        else:
            rejected.append(RejectedRow(start, problem, raw, row))
    return RowsRead(path, header, rows, rejected)


def _header(path: Path, line: str, schema: RowSchema) -> list[str]:
    """The columns of a header line; :class:`DamagedFileError` when not a header of this kind of file."""
    try:
        header = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        header = []
    advice = ("the file is left as it is: repair its header, or move it away to start afresh "
              "(--overwrite discards it)")
    missing = missing_columns(header, schema)
    if missing:
        raise DamagedFileError(f"{path} line 1: the header lacks the column(s) {missing} of "
                               f"{schema.name}; {advice}")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise DamagedFileError(f"{path} line 1: the header has the column(s) {repeated} more "
                               f"than once; {advice}")
    return header


def warn_rejected(read: RowsRead, action: str = "left out") -> None:
    """One :class:`DamagedRowWarning` per damaged line of ``read``."""
    for bad in read.rejected:
        warnings.warn(f"{read.path} line {bad.line}: {bad.problem}; the row is {action}",
                      DamagedRowWarning, stacklevel=2)


def read_rows(run_dir: str | Path, file: str = RESULTS_FILE,
              columns: list[str] = COLUMNS) -> list[dict[str, str]]:
    """Valid rows of a results file, warning of each damaged line (:func:`read_table`)."""
    read = read_table(run_dir, file, columns)
    warn_rejected(read)
    return read.rows


def _csv_text(rows: list[dict[str, Any]], header: bool, columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class ResultsWriter:
    """Appends rows to a results file, fsynced per unit; ``rows``: first rewritten atomically with them (resume)."""

    def __init__(self, run_dir: str | Path, rows: list[dict[str, Any]] | None = None,
                 file: str = RESULTS_FILE, columns: list[str] = COLUMNS) -> None:
        self.path = Path(run_dir) / file
        self.columns = columns
        if rows is not None or not self.path.exists() or self.path.stat().st_size == 0:
            atomic_write_text(self.path, _csv_text(rows or [], True, columns))

    def append(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a", newline="") as f:
            f.write(_csv_text(rows, False, self.columns))
            f.flush()
            os.fsync(f.fileno())


def read_env(run_dir: str | Path) -> list[dict[str, Any]]:
    """The environment of every run segment (one per sweep invocation that wrote rows)."""
    path = Path(run_dir) / ENV_FILE
    if not path.exists():
        return []
    data = read_json(path, what="environment file")
    if isinstance(data, dict) and "segments" in data:
        return list(data["segments"])
    return [data] if isinstance(data, dict) else []


def write_env(run_dir: str | Path, segments: list[dict[str, Any]]) -> None:
    """Write every segment's environment (atomically)."""
    atomic_write_json(Path(run_dir) / ENV_FILE, {"segments": segments})
