"""The provenance a page shows at its top, from a run directory's segments (``env.json``) and rows."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bench.engine.fsutil import read_json
from bench.engine.provenance import cpu_summary
from bench.engine.results import read_env

#: the saved config of each kind of run, and the key of its name
_CONFIGS = (("sweep.json", "name"), ("grid.json", None))


def _listed(values: Iterable[object]) -> str:
    """Distinct non-empty values in first-seen order, joined by ``; `` (``-``: none)."""
    return "; ".join(dict.fromkeys(str(v) for v in values if v not in (None, ""))) or "-"


def _config_note(run_dir: Path) -> str:
    """What the run directory says of its config when no command line was recorded."""
    for file, key in _CONFIGS:
        path = run_dir / file
        if path.is_file():
            saved = read_json(path, what="saved config")
            name = saved.get(key) if key and isinstance(saved, dict) else None
            return f"its config is saved in {file}" + (f" (name: {name})" if name else "")
    return "no saved config"


def run_provenance(run_dir: str | Path, commits: Iterable[str] = ()) -> dict[str, str]:
    """``{what: value}`` of ``run_dir``: commits (the segments' and ``commits``), machines, settings, commands."""
    run_dir = Path(run_dir)
    segments = read_env(run_dir)
    machines = [f"{s.get('device_name', '?')} on {s.get('hostname', '?')} ({s.get('cpu_count', '?')} CPUs, "
                f"{s.get('platform', '?')})" for s in segments]
    commands = [s.get("command", "") for s in segments]
    recorded = _listed(commands)
    if recorded == "-":
        recorded = f"not recorded (written before env.json kept it); {_config_note(run_dir)}"
    elif not all(commands):
        recorded += f" (earlier segments: not recorded; {_config_note(run_dir)})"
    times = sorted(str(s.get("timestamp", "")) for s in segments if s.get("timestamp"))
    return {
        "run directory": str(run_dir),
        "commit(s)": _listed([*(s.get("git_sha") for s in segments), *commits]),
        "machine(s)": _listed(machines),
        "CPU(s)": _listed(cpu_summary(s) for s in segments),
        "torch": _listed(s.get("torch_version") for s in segments),
        "threads": _listed(s.get("threads") for s in segments),
        "allocator": _listed(s.get("allocator") for s in segments),
        "command line(s)": recorded,
        "segments": f"{len(segments)}" + (f", {times[0]} to {times[-1]}" if times else ""),
    }
