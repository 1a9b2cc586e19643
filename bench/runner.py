"""One config into one run directory (``attn-bench sweep``); :func:`run_plan` is where the kinds of config part."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.engine.config import (
    ConfigError,
    import_plugins,
    key_error,
    plugin_modules,
    plugin_ref,
    read_config,
    safe_name,
)
from bench.engine.executors import Executor, ExecutorSpec
from bench.engine.rundir import DryRun, Rows, dry_run_units, run_units
from bench.pretrained.config import OVERRIDES as PRETRAINED_OVERRIDES
from bench.pretrained.config import TASKS as PRETRAINED_TASKS
from bench.pretrained.config import PretrainedConfig, is_pretrained, parse_pretrained
from bench.pretrained.plan import PretrainedPlan
from bench.quality.grid import GridPlan
from bench.quality.grid_config import OVERRIDES as GRID_OVERRIDES
from bench.quality.grid_config import GridConfig, is_grid, only_seeds, only_tasks, parse_grid
from bench.speed.config import OVERRIDES as SWEEP_OVERRIDES
from bench.speed.config import SweepConfig, apply_overrides, parse_config
from bench.speed.noise import noisy_in
from bench.speed.sweep import SweepPlan

RunConfig = SweepConfig | GridConfig | PretrainedConfig
WorkPlan = SweepPlan | GridPlan | PretrainedPlan  # the RunPlan of each kind of config

__all__ = ["RunConfig", "WorkPlan", "default_run_dir", "dry_run", "load_run", "noisy_rows", "run",
           "run_plan", "size_of"]


def load_run(source: str | Path | Mapping[str, Any],
             overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The config ``source`` names (path, preset or mapping), plug-ins imported, ``overrides`` applied, validated."""
    if isinstance(source, Mapping):
        where, raw = "<config>", dict(source)
    else:
        path, raw = read_config(source)
        where = str(path)
    changes = {k: v for k, v in (overrides or {}).items() if v is not None}
    if is_pretrained(raw):
        return _load_pretrained(raw, changes, where)
    grid = is_grid(raw)
    _check_overrides(changes, grid)
    raw = _import_plugins(raw, changes.pop("plugins", None))
    if not grid:
        return parse_config(apply_overrides(raw, changes), source=where)
    for key in ("device", "threads"):
        if key in changes:
            raw = {**raw, key: changes[key]}
    config = parse_grid(raw, only=changes.get("variants"))  # the other entries' rows stay
    if changes.get("tasks"):
        config = only_tasks(config, changes["tasks"])
    return only_seeds(config, changes["seeds"]) if changes.get("seeds") else config


def _import_plugins(raw: Any, extra: list[str] | None) -> Any:
    """``raw`` with the ``--plugin`` modules ``extra``, its plug-ins imported (they register what it names)."""
    extra = tuple(plugin_ref(p) for p in extra or ())
    if extra and isinstance(raw, dict):
        raw = {**raw, "plugins": list(dict.fromkeys((*plugin_modules(raw), *extra)))}
    import_plugins(plugin_modules(raw))
    return raw


def _load_pretrained(raw: dict[str, Any], changes: dict[str, Any], where: str) -> PretrainedConfig:
    """A pretrained-model config: ``variants`` and ``tasks`` select, the other overrides replace."""
    unknown = sorted(set(changes) - set(PRETRAINED_OVERRIDES))
    if unknown:
        raise ConfigError(f"overrides: unknown key {unknown[0]!r}; a pretrained-model run takes "
                          f"{list(PRETRAINED_OVERRIDES)}", unknown[0])
    raw = dict(raw)
    for key in ("threads", "text", "model"):
        if key in changes:
            raw[key] = changes[key]
    config = parse_pretrained(_import_plugins(raw, changes.get("plugins")), source=where)
    if changes.get("variants"):
        wanted = set(changes["variants"])
        kept = [e for e in config.raw["patterns"] if e.get("variant") in wanted]
        if not kept:
            raise ConfigError(f"variants: none of {sorted(wanted)} is a pattern of the config; it has "
                              f"{sorted({e.variant for e in config.patterns})}", "variants")
        config = parse_pretrained({**config.raw, "patterns": kept}, source=where)
    if changes.get("seq_len"):  # the passkey and prefill lengths to run now (one forward reads every perplexity length)
        wanted = set(changes["seq_len"])
        raw = dict(config.raw)
        for task in ("passkey", "prefill"):
            if raw.get(task) is not None:
                lengths = getattr(config, task).lengths
                raw[task] = {**raw[task], "lengths": [n for n in lengths if n in wanted] or sorted(wanted)}
        config = parse_pretrained(raw, source=where)
    if changes.get("tasks"):
        bad = sorted(set(changes["tasks"]) - set(PRETRAINED_TASKS))
        if bad:
            raise ConfigError(f"tasks: unknown task {bad[0]!r}; a pretrained-model run has "
                              f"{list(PRETRAINED_TASKS)}", "tasks")
        config = parse_pretrained({k: v for k, v in config.raw.items()
                                   if k not in PRETRAINED_TASKS or k in changes["tasks"]}, source=where)
    return config


def _check_overrides(changes: Mapping[str, Any], grid: bool) -> None:
    """Every override is one the config's kind takes."""
    allowed = GRID_OVERRIDES if grid else SWEEP_OVERRIDES
    for key in changes:
        if key in allowed:
            continue
        if key in SWEEP_OVERRIDES:
            raise key_error(key, f"a speed-sweep setting; a training grid (kind: quality) takes "
                                 f"only {list(GRID_OVERRIDES)} from outside its file")
        if key in GRID_OVERRIDES:
            raise key_error(key, f"only a training grid (kind: quality) has {key} to choose "
                                 "among; a speed sweep has none")
        raise ConfigError(f"overrides: unknown key {key!r}; a "
                          f"{'training grid' if grid else 'speed sweep'} takes {list(allowed)}", key)


def run_plan(config: RunConfig) -> WorkPlan:
    """The product's run plan of ``config`` (its units, results file and rows)."""
    if isinstance(config, GridConfig):
        return GridPlan(config)
    if isinstance(config, PretrainedConfig):
        return PretrainedPlan(config)
    return SweepPlan.of(config)


def _work(config: RunConfig | WorkPlan) -> WorkPlan:
    return run_plan(config) if isinstance(config, (SweepConfig, GridConfig, PretrainedConfig)) else config


def size_of(work: WorkPlan) -> str:
    """How much a run plan holds, said: ``12 cases in the config``."""
    return f"{work.size()} in the {'grid' if isinstance(work, GridPlan) else 'config'}"


def default_run_dir(config: RunConfig) -> Path:
    """Where a run of ``config`` goes when no directory is given: ``runs/<name>``."""
    return Path("runs") / safe_name(config.name)


def dry_run(config: RunConfig | WorkPlan, run_dir: Path, *, allow_mixed: bool = False,
            local: bool = True) -> DryRun:
    """What :func:`run` would do in ``run_dir``, nothing run or written (:func:`dry_run_units`)."""
    return dry_run_units(run_dir, _work(config), allow_mixed=allow_mixed, local=local)


def run(config: RunConfig | WorkPlan, run_dir: Path, *,
        executor: Executor | ExecutorSpec | None = None, allow_mixed: bool = False,
        retry_failed: bool = False, retry_noisy: bool = False, overwrite: bool = False,
        on_start: Callable[[Any], None] | None = None,
        on_done: Callable[[Any, Rows], None] | None = None) -> Rows:
    """Run every unit of ``config`` not done yet into ``run_dir`` (:func:`run_units`); the new rows."""
    work = _work(config)
    return run_units(run_dir, work, executor=executor, allow_mixed=allow_mixed,
                     retry_failed=retry_failed, overwrite=overwrite,
                     redo=noisy_rows(work, run_dir) if retry_noisy else None, on_start=on_start,
                     on_done=on_done)


def noisy_rows(work: WorkPlan, run_dir: Path) -> Callable[[dict[str, Any]], bool]:
    """``--retry-noisy``'s test (:func:`bench.speed.noise.noisy_in`); ``ConfigError`` for a training grid."""
    if isinstance(work, GridPlan):
        raise ConfigError("--retry-noisy: only a speed sweep flags noisy rows; a training grid "
                          "(kind: quality) has none (--retry-failed retrains failed runs)")
    return noisy_in(run_dir)
