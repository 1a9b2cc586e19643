"""``attn-bench sweep``: speed sweeps and training grids, resumable, with a progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bench.cli.app import app
from bench.cli.common import (
    PluginOpt,
    UsageError,
    as_option,
    check_device_option,
    check_writable,
    choice,
    import_plugin_options,
    stop_on_signals,
    user_errors,
)

#: sweep options that override config keys, by option name
_OVERRIDES = {"variant": "variants", "kernel": "kernels", "seq_len": "seq_len", "pass_": "passes",
              "repeats": "repeats", "timeout_s": "timeout_s", "device": "device", "dtype": "dtype",
              "threads": "threads"}
_OPTION_NAMES = {"variants": "--variant", "kernels": "--kernel", "seq_len": "--seq-len",
                 "passes": "--pass", "repeats": "--repeats", "timeout_s": "--timeout-s",
                 "device": "--device", "dtype": "--dtype", "threads": "--threads"}


def _load_with_overrides(config: str, options: dict[str, Any], plugin: list[str] | None):
    """The config with CLI overrides, validated like the YAML (errors name the option)."""
    from bench.engine.config import ConfigError
    from bench.speed.config import load_config, with_overrides

    cfg = load_config(config)
    overrides = {_OVERRIDES[k]: v for k, v in options.items() if v is not None}
    if plugin:
        overrides["plugins"] = list(dict.fromkeys((*cfg.plugins, *plugin)))
    try:
        return with_overrides(cfg, **overrides)
    except ConfigError as err:
        key = (err.key or "").split("[")[0].split(".")[0]
        if key in overrides and key in _OPTION_NAMES:
            raise as_option(err, _OPTION_NAMES[key]) from None
        raise


def _no_cases(cfg: Any, kernel_option: bool) -> UsageError:
    """The error for a sweep without cases: no variant has any of the requested kernels."""
    from attn import attention_info

    requested = sorted({k for v in cfg.variants for k in (v.kernels or cfg.kernels)})
    have = "; ".join(f"{v.label} has {['auto', 'all', *attention_info(v.name).kernels]}"
                     for v in cfg.variants)
    where = "--kernel" if kernel_option else "config key 'kernels'"
    return UsageError(f"{where}: the sweep has no cases: no variant has any of the requested "
                      f"kernels {requested}; allowed values: {have}")


def _check_executor(executor: str, address: str | None, connect_timeout_s: float | None) -> None:
    """``--executor`` is known, ``--address`` goes only with ``ray`` and
    ``--connect-timeout-s`` only with ``--address``."""
    from bench.engine.executors import EXECUTORS

    choice("--executor", executor, EXECUTORS)
    if address is not None and executor != "ray":
        raise UsageError(f"--address: only the 'ray' executor takes an address; got --executor "
                         f"{executor}; allowed: --executor ray --address HOST:PORT, or no --address")
    if connect_timeout_s is not None:
        if address is None:
            raise UsageError("--connect-timeout-s: only with --executor ray --address HOST:PORT "
                             "(how long the Ray head there may take to answer)")
        if not connect_timeout_s > 0:
            raise UsageError(f"--connect-timeout-s: must be a number > 0 (e.g. 30); got "
                             f"{connect_timeout_s:g}")


@app.command()
@user_errors
def sweep(
    config: Annotated[str, typer.Argument(help="YAML file or preset name (quick, scaling-cpu, ...).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default runs/<name>).")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        help="Run only these variants (default params); repeatable; plug-ins welcome.")] = None,
    kernel: Annotated[list[str] | None, typer.Option(help="Kernels to run (auto or names); repeatable.")] = None,
    seq_len: Annotated[list[int] | None, typer.Option(help="Sequence lengths; repeatable.")] = None,
    pass_: Annotated[list[str] | None, typer.Option("--pass", help="Passes: fwd, bwd, fwd_bwd; repeatable.")] = None,
    repeats: Annotated[int | None, typer.Option(help="At most this many timed repeats per pass.")] = None,
    timeout_s: Annotated[float | None, typer.Option(help="Time limit per case and pass (s).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda.")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, float16, bfloat16, float64.")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads per case.")] = None,
    plugin: PluginOpt = None,
    executor: Annotated[str, typer.Option(help="Where cases run: local or ray.")] = "local",
    address: Annotated[str | None, typer.Option(
        help="Ray cluster address HOST:PORT (ray executor; default: start a local Ray).")] = None,
    connect_timeout_s: Annotated[float | None, typer.Option(
        help="How long the Ray head at --address may take to answer and be joined (s; "
             "default 30).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Skip finished cases (the default; kept for clarity).")] = True,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Measure failed, timed-out and skipped cases again; keep the rest.")] = False,
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Add rows to a run measured on another commit, device, dtype or "
                              "thread count (the report lists where each row came from).")] = False,
    overwrite: Annotated[bool, typer.Option(help="Discard previous results in --out first.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cases and exit.")] = False,
    plots: Annotated[bool, typer.Option(help="Write report.md and plots at the end.")] = True,
    task: Annotated[list[str] | None, typer.Option(
        help="Training grids only: train only these tasks of the grid (the other tasks' rows "
             "stay as they are); repeatable.")] = None,
) -> None:
    """Run a speed sweep, or a training grid (a config with ``kind: quality``), into a run
    directory; resumable: finished cases and training runs are kept."""
    from rich.console import Console

    from bench.engine.config import safe_name
    from bench.engine.results import RESULTS_FILE
    from bench.engine.row_schema import COLUMNS
    from bench.engine.rundir import resumable_rows
    from bench.speed.cases import expand_cases

    import_plugin_options(plugin)
    _check_executor(executor, address, connect_timeout_s)
    options = {"variant": variant, "kernel": kernel, "seq_len": seq_len, "pass_": pass_,
               "repeats": repeats, "timeout_s": timeout_s, "device": device, "dtype": dtype,
               "threads": threads}
    run_options = {"executor": executor, "address": address, "allow_mixed": allow_mixed,
                   "retry_failed": retry_failed, "overwrite": overwrite,
                   "connect_timeout_s": connect_timeout_s}
    raw = _raw_config(config)
    if _is_grid(raw):
        if plugin:
            raw = {**raw, "plugins": list(dict.fromkeys((*raw.get("plugins", []), *plugin)))}
        _sweep_grid(raw, out, {**options, "task": task}, run_options, dry_run=dry_run, plots=plots)
        return
    if task:
        raise UsageError("--task: a training-grid option (a config with kind: quality); a speed "
                         "sweep has no tasks")
    cfg = _load_with_overrides(config, options, plugin)
    run_dir = out or Path("runs") / safe_name(cfg.name)
    cases = expand_cases(cfg)
    if not cases:
        raise _no_cases(cfg, kernel_option=kernel is not None)
    console = Console(stderr=True)
    if dry_run:
        done = ({(r["case_id"], r["pass"]) for r in resumable_rows(run_dir, RESULTS_FILE, COLUMNS)}
                if resume else set())
        finished = [all((c.case_id, p) in done for p in c.passes) for c in cases]
        for i, (case, mark) in enumerate(zip(cases, finished)):
            typer.echo(f"{i + 1:4d} {case.case_id} {'done' if mark else 'todo'} {case.describe()}")
        typer.echo(f"{len(cases)} cases, {sum(finished)} already done in {run_dir}")
        return
    check_device_option(cfg.device, "--device" if device is not None else None)
    check_writable(run_dir)
    from bench.speed.sweep import run_sweep

    statuses = _run_with_progress(run_sweep, cfg, run_dir, console, _speed_states,
                                  results_file=RESULTS_FILE, **run_options)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "nothing new"
    console.print(f"{run_dir}: {summary} rows this run ({len(cases)} cases in the config)")
    if plots:
        _report_and_plot(run_dir, console)


def _speed_states(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['kernel_requested']} {r['pass']} {r['status']}" for r in rows)


def _grid_states(rows: list[dict[str, Any]]) -> str:
    found = [r for r in rows if r.get("split") == "test" and not r.get("condition")]
    return ", ".join(f"{r['metric']} {r['value']:.4g}" for r in found) or rows[0]["status"]


def _raw_config(config: str) -> Any:
    from bench.engine.config import load_yaml, resolve_config_path

    return load_yaml(resolve_config_path(config))


def _is_grid(raw: Any) -> bool:
    from bench.quality.grid_config import is_grid

    return is_grid(raw)


#: speed-sweep options a training grid does not take
_SPEED_ONLY = {"kernel": "--kernel", "seq_len": "--seq-len", "pass_": "--pass",
               "repeats": "--repeats", "timeout_s": "--timeout-s", "dtype": "--dtype"}


def _sweep_grid(raw: dict[str, Any], out: Path | None, options: dict[str, Any],
                run_options: dict[str, Any], *, dry_run: bool, plots: bool) -> None:
    """``attn-bench sweep`` of a training grid (``kind: quality``)."""
    from rich.console import Console

    from bench.engine.config import safe_name
    from bench.engine.row_schema import QUALITY_COLUMNS
    from bench.engine.rundir import resumable_rows
    from bench.quality.grid import QUALITY_FILE, run_grid, superseded_units
    from bench.quality.grid_config import only_tasks, parse_grid
    from bench.quality.units import units

    for key, option in _SPEED_ONLY.items():
        if options.get(key) is not None:
            raise UsageError(f"{option}: a speed-sweep option; a training grid (kind: quality) "
                             "takes --variant, --device, --threads and the run options")
    for key in ("device", "threads"):
        if options.get(key) is not None:
            raw = {**raw, key: options[key]}
    grid = parse_grid(raw, only=options.get("variant") or None)  # the others' rows stay
    if options.get("task"):
        grid = only_tasks(grid, options["task"])  # the other tasks' rows stay too
    run_dir = out or Path("runs") / safe_name(grid.name)
    todo = units(grid, run_dir)
    if dry_run:
        rows = resumable_rows(run_dir, QUALITY_FILE, QUALITY_COLUMNS)
        stale = superseded_units(rows, grid)
        done = {r["unit_id"] for r in rows} - stale
        for i, unit in enumerate(todo):
            state = "done" if unit.unit_id in done else "todo (settings changed)" if unit.unit_id in stale else "todo"
            typer.echo(f"{i + 1:4d} {unit.unit_id} {state} {unit.describe()}")
        typer.echo(f"{len(todo)} training runs, {sum(u.unit_id in done for u in todo)} already "
                   f"done in {run_dir}")
        return
    check_device_option(grid.device, "--device" if options.get("device") else None)
    check_writable(run_dir)
    console = Console(stderr=True)
    statuses = _run_with_progress(run_grid, grid, run_dir, console, _grid_states,
                                  results_file=QUALITY_FILE, **run_options)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "nothing new"
    console.print(f"{run_dir}: {summary} rows this run ({len(todo)} training runs in the grid)")
    if plots:
        _report_and_plot(run_dir, console)


def _run_with_progress(run: Any, cfg: Any, run_dir: Path, console: Any,
                       states: Any, results_file: str, **options: Any) -> dict[str, int]:
    """``run(cfg, run_dir, ...)`` (a sweep or a grid) under a progress bar; Ctrl-C, SIGTERM and
    SIGHUP stop it cleanly; ``states(rows)`` is the one-line log of a unit (CI logs)."""
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from bench.engine.executors import make_executor
    from bench.engine.process import kill_all_workers

    executor = make_executor(options.pop("executor"), device=cfg.device,
                             address=options.pop("address"),
                             connect_timeout_s=options.pop("connect_timeout_s"))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    statuses: dict[str, int] = {}
    stop_on_signals()
    # started at the first unit, so that an error before any case runs (a locked or mixed
    # run directory, a corrupt file in it) prints its one line and no progress bar
    progress = Progress(*columns, console=console, transient=False)
    task = progress.add_task("starting", total=None)

    def on_start(unit: Any) -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(task, description=f"[cyan]{escape(unit.describe())}")

    def on_done(unit: Any, rows: list[dict[str, Any]]) -> None:
        progress.advance(task)
        for row in rows:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        if not console.is_terminal:  # logs (CI): one line per finished unit
            console.print(f"{unit.describe()}: {states(rows)}", markup=False, highlight=False)

    try:
        run(cfg, run_dir, executor=executor, on_start=on_start, on_done=on_done, **options)
        progress.update(task, description="done")
    except KeyboardInterrupt as stop:
        kill_all_workers()
        _stop_progress(progress)
        how = str(stop) or "Ctrl-C"
        console.print(f"stopped by {how}: every finished unit is in {run_dir / results_file}; "
                      "rerun the same command to resume")
        raise typer.Exit(130) from None
    finally:
        _stop_progress(progress)
    return statuses


def _stop_progress(progress: Any) -> None:
    """Stop a progress display if it was started (stopping an unstarted one prints a line)."""
    if progress.live.is_started:
        progress.stop()


def _report_and_plot(run_dir: Path, console: Any) -> None:
    from bench.quality.plots import plot_quality_run
    from bench.quality.report import build_quality_report, is_quality_run
    from bench.speed.plots import plot_run
    from bench.speed.report import build_report

    quality = is_quality_run(run_dir)
    (build_quality_report if quality else build_report)(run_dir)
    try:
        paths = plot_quality_run(run_dir) if quality else plot_run(run_dir)
    except ValueError as err:
        console.print(f"no plots: {err}")
        return
    console.print(f"wrote {run_dir / 'report.md'}, " + ", ".join(str(p) for p in paths))
