"""The history store: every run's history rows in one SQLite file, read again only for the runs whose
results changed (why SQLite: docs/history.md)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from bench.html.history_rows import COLUMNS, find_runs, history_rows

STORE_FILE = "history.sqlite"
SCHEMA_VERSION = "4"
_RESULTS = ("results.csv", "quality.csv")
#: the columns of the cases table, quoted (``case`` is an SQL keyword)
_QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)


def _signature(run_dir: Path) -> str:
    """The results files' sizes and times."""
    parts = []
    for name in (*_RESULTS, "env.json"):
        path = run_dir / name
        if path.is_file():
            stat = path.stat()
            parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
    return ";".join(parts)


def connect(path: Path) -> sqlite3.Connection:
    """The store at ``path``, its tables made (emptied when of another :data:`SCHEMA_VERSION`)."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if found is None or found[0] != SCHEMA_VERSION:
        db.executescript("DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS cases;")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
    db.execute("CREATE TABLE IF NOT EXISTS runs (run TEXT PRIMARY KEY, signature TEXT)")
    db.execute(f"CREATE TABLE IF NOT EXISTS cases ({_QUOTED})")
    db.execute("CREATE INDEX IF NOT EXISTS series ON cases (figure, \"case\", machine)")
    db.execute("CREATE INDEX IF NOT EXISTS by_run ON cases (run)")
    db.execute("CREATE TABLE IF NOT EXISTS commits (sha TEXT PRIMARY KEY, time TEXT, source TEXT)")
    return db


def _is_ours(db: sqlite3.Connection) -> bool:
    if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
        return False
    columns = {table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
               for table in ("runs", "cases", "commits")}
    return (columns["runs"] == ["run", "signature"] and columns["cases"] == list(COLUMNS)
            and columns["commits"] == ["sha", "time", "source"])


def open_store(path: Path) -> sqlite3.Connection:
    """The store at ``path``; a damaged or foreign file is replaced by an empty store, with a warning."""
    try:
        db = connect(path)
        if _is_ours(db):
            return db
        db.close()
        problem = "tables or columns of another program"
    except sqlite3.DatabaseError as err:
        problem = str(err)
    warnings.warn(f"{path}: not a history store of this version ({problem}); rebuilt from the run folders",
                  stacklevel=2)
    path.unlink()
    return connect(path)


def update_store(db: sqlite3.Connection, runs: Iterable[Path], base: Path) -> tuple[int, int]:
    """Read the runs (named relative to ``base``) whose results changed, drop those gone; ``(read, kept)``."""
    names = {Path(os.path.relpath(run.resolve(), base.resolve())).as_posix(): run for run in runs}
    known = dict(db.execute("SELECT run, signature FROM runs").fetchall())
    read = kept = 0
    with db:
        for gone in set(known) - set(names):
            db.execute("DELETE FROM cases WHERE run = ?", (gone,))
            db.execute("DELETE FROM runs WHERE run = ?", (gone,))
        db.execute("DELETE FROM cases WHERE run NOT IN (SELECT run FROM runs)")  # rows of no known run
        for name, run in names.items():
            signature = _signature(run)
            if known.get(name) == signature:
                kept += 1
                continue
            rows = history_rows(run, name)
            db.execute("DELETE FROM cases WHERE run = ?", (name,))
            db.executemany(f"INSERT INTO cases VALUES ({', '.join('?' * len(COLUMNS))})",
                           [tuple(None if pd.isna(v) else v for v in row) for row in
                            rows.itertuples(index=False)])
            db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?)", (name, signature))
            read += 1
    return read, kept


def commit_times(db: sqlite3.Connection, repo: Path) -> None:
    """Record untimed commits' times: from git in ``repo``, else the commit's earliest row (``first row``)."""
    shas = [r[0] for r in db.execute(
        "SELECT DISTINCT commit_sha FROM cases WHERE commit_sha NOT IN (SELECT sha FROM commits)")]
    if not shas:
        return
    timed = {}
    plain = sorted({s.split("+")[0] for s in shas})
    try:
        out = subprocess.run(["git", "show", "-s", "--format=%H %cI", *plain], cwd=repo,
                             capture_output=True, text=True, timeout=30).stdout
        timed = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    except (OSError, subprocess.SubprocessError):
        pass
    with db:
        for sha in shas:
            time = timed.get(sha.split("+")[0])
            if time:
                db.execute("INSERT INTO commits VALUES (?, ?, 'git')", (sha, time))
            else:
                first = db.execute("SELECT MIN(timestamp) FROM cases WHERE commit_sha = ?", (sha,)).fetchone()[0]
                db.execute("INSERT INTO commits VALUES (?, ?, 'first row')", (sha, first or ""))


def gather(roots: list[Path], out: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """Update ``out/history.sqlite`` from the runs under ``roots``; the rows with commit times, and the counts."""
    runs = find_runs(roots)
    db = open_store(out / STORE_FILE)
    try:
        read, kept = update_store(db, runs, out)
        commit_times(db, roots[0] if roots[0].is_dir() else Path.cwd())
        table = pd.read_sql_query(
            "SELECT cases.*, commits.time AS commit_time, commits.source AS commit_time_source "
            "FROM cases JOIN runs ON runs.run = cases.run JOIN commits ON commits.sha = cases.commit_sha "
            "ORDER BY figure, \"case\", machine, commit_time, timestamp", db)
    finally:
        db.close()
    return table, {"runs": len(runs), "read": read, "kept": kept}
