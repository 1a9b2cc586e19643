"""One run directory's rows as history rows: one per (figure, case), commit and machine, with the run's spread."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.decoding.results import load_decoding
from bench.engine.results import read_env
from bench.speed.compare import KEY

#: ``title`` and ``lower_is_better`` kept with the rows: a page of an unchanged store needs no task registry
COLUMNS = ["run", "kind", "commit_sha", "machine", "case", "figure", "value", "spread", "n",
           "status", "timestamp", "title", "lower_is_better"]
#: what each figure's value is, and whether a smaller one is better
FIGURES = {"time_ms": ("time (ms)", True), "memory_mib": ("peak tensor memory (MiB)", True),
           "tokens_per_s": ("decoding tokens/s", False), "step_ms": ("streaming step (ms)", True)}


def machine(device_name: object, threads: object, hostname: object, cpu: str = "") -> str:
    """A machine's fingerprint: its device (with the CPU's vector capability where the run was on
    the CPU and recorded it: two CPUs of one model name differ by it), threads and host name."""
    def text(value: object) -> str:
        return "?" if value is None or pd.isna(value) or value == "" else str(value)
    device = f"{text(device_name)} ({cpu})" if cpu else text(device_name)
    return f"{device}, {text(threads)} threads, host {text(hostname)}"


def _cpu_kinds(segments: list[dict], shas: pd.Series, timestamps: pd.Series) -> list[str]:
    """Per row, ``cpu_capability`` of the CPU run segment of ``env.json`` that wrote it: the latest
    of its commit started no later than the row (else the latest of its commit); '' if none."""
    segments = sorted(segments, key=lambda s: str(s.get("timestamp", "")))

    def kind(sha: str, timestamp: str) -> str:
        ours = [s for s in segments if str(s.get("git_sha")) == sha]
        before = [s for s in ours if str(s.get("timestamp", "")) <= timestamp]
        found = (before or ours or [{}])[-1]
        return str(found.get("cpu_capability") or "") if found.get("device") == "cpu" else ""
    return [kind(str(sha), str(ts)) for sha, ts in zip(shas, timestamps)]


def _machines(run_dir: Path, df: pd.DataFrame) -> list[str]:
    """Each row's :func:`machine`, from its own columns and its ``env.json`` segment."""
    cpus = _cpu_kinds(read_env(run_dir), df.git_sha, df.timestamp)
    return [machine(*r) for r in zip(df.device_name, df.threads, df.hostname, cpus)]


def _speed_case(row: pd.Series) -> str:
    causal = " causal" if row.causal is True else ""
    return (f"{row.label} [{row.kernel_requested}] {row['pass']} N={row.seq_len} B={row.batch} "
            f"H={row.heads} D={row.head_dim} {row['dtype']} {row.device}{causal}")


def _speed(run_dir: Path) -> pd.DataFrame:
    from bench.speed.results import load_results  # lazy: imports torch; an unchanged store's page needs none

    df = load_results(run_dir).drop_duplicates([*KEY, "git_sha"], keep="last")
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    base = pd.DataFrame({
        "kind": "speed", "commit_sha": df.git_sha.astype(str),
        "machine": _machines(run_dir, df),
        "case": df.apply(_speed_case, axis=1), "n": df.repeats, "status": df.status,
        "timestamp": df.timestamp.astype(str)})
    time = base.assign(figure="time_ms", value=df.time_ms, spread=df.time_iqr_ms)
    memory = base.assign(figure="memory_mib", value=df.peak_mem_bytes / 2**20, spread=float("nan"))
    return pd.concat([time, memory], ignore_index=True)


def _quality(run_dir: Path) -> pd.DataFrame:
    from bench.quality.report import load_quality  # lazy: imports torch; an unchanged store's page needs none
    from bench.quality.tables import headline  # lazy: imports torch; an unchanged store's page needs none

    df = load_quality(run_dir)
    top = headline(df) if len(df) else df
    if top.empty:
        return pd.DataFrame(columns=COLUMNS)
    top = top.assign(machine=_machines(run_dir, top),
                     value=[v * (100.0 if m == "accuracy" else 1.0) for v, m in zip(top.value, top.metric)])
    grouped = top.groupby(["git_sha", "machine", "task", "label", "metric"], sort=False)
    stats = grouped.agg(value=("value", "mean"), spread=("value", "std"), n=("value", "size"),
                        timestamp=("timestamp", "max")).reset_index()
    return pd.DataFrame({
        "kind": "quality", "commit_sha": stats.git_sha.astype(str), "machine": stats.machine,
        "case": stats.task + ": " + stats.label, "figure": stats.metric, "value": stats.value,
        "spread": stats.spread, "n": stats.n, "status": "ok", "timestamp": stats.timestamp.astype(str)})


def _decoding(run_dir: Path) -> pd.DataFrame:
    df = load_decoding(run_dir)
    segments = read_env(run_dir)
    env = (segments or [{}])[0]
    cpus = _cpu_kinds(segments, df.git_sha, df.timestamp)
    where = [machine(env.get("device_name"), t, env.get("hostname"), cpu) for t, cpu in zip(df.threads, cpus)]
    decoding = df.benchmark == "decoding"
    cases = [f"{r.attention} context={r.context} {'cache' if r.use_cache else 'no cache'}" if d
             else f"streaming window={r.window} layers={r.num_layers}" for d, r in zip(decoding, df.itertuples())]
    return pd.DataFrame({
        "kind": "decoding", "commit_sha": df.git_sha.astype(str), "machine": where, "case": cases,
        "figure": ["tokens_per_s" if d else "step_ms" for d in decoding],
        "value": [r.tokens_per_s if d else r.step_ms for d, r in zip(decoding, df.itertuples())],
        "spread": float("nan"), "n": df.repeats, "status": "ok", "timestamp": df.timestamp.astype(str)})


def figure_meta(figure: str) -> tuple[str, bool]:
    """``(title, lower_is_better)`` of a figure, a quality metric's as the tasks name it (accuracy in %)."""
    if figure in FIGURES:
        return FIGURES[figure]
    from bench.quality.tasks import headline_titles, lower_is_better  # lazy: the task registry imports torch

    title = headline_titles().get(figure, figure)
    return (f"{title} (%)" if figure == "accuracy" else title), lower_is_better(figure)


def history_rows(run_dir: str | Path, name: str) -> pd.DataFrame:
    """The history rows of ``run_dir``, its ``run`` column ``name`` (the path the page links)."""
    from bench.html.report import run_kind  # lazy: it imports the run loaders and torch

    run_dir = Path(run_dir)
    read = {"speed": _speed, "quality": _quality, "decoding": _decoding}[run_kind(run_dir)]
    rows = read(run_dir).assign(run=name)
    rows["n"] = pd.to_numeric(rows.n, errors="coerce")
    meta = {figure: figure_meta(figure) for figure in rows.figure.unique()}
    rows["title"] = [meta[f][0] for f in rows.figure]
    rows["lower_is_better"] = [int(meta[f][1]) for f in rows.figure]
    return rows[COLUMNS]


def find_runs(roots: list[Path]) -> list[Path]:
    """Every run directory (``results.csv`` or ``quality.csv``) under ``roots`` or a root itself, sorted."""
    found: set[Path] = set()
    for root in roots:
        for file in ("results.csv", "quality.csv"):
            found.update(p.parent for p in root.rglob(file))
            if (root / file).is_file():
                found.add(root)
    return sorted(found)
