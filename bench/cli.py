"""The ``attn-bench`` command line: list, sweep, plot, report, compare, check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Long-sequence attention benchmark suite.", no_args_is_help=True,
                  pretty_exceptions_enable=False)

PluginOpt = Annotated[
    list[str] | None,
    typer.Option("--plugin", help="Import this module first (it registers attentions); repeatable."),
]


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _plugins(modules: list[str] | None) -> None:
    from bench.config import ConfigError, import_plugins

    try:
        import_plugins(tuple(modules or ()))
    except ConfigError as err:
        _fail(str(err))


def _run_dir(path: Path) -> Path:
    if not (path / "results.csv").exists():
        _fail(f"{path} is not a run directory (no results.csv); run `attn-bench sweep` first")
    return path


@app.callback()
def main() -> None:
    """Benchmark attention variants: list, sweep, plot, report, compare, check."""


@app.command("list")
def list_command(
    plugin: PluginOpt = None,
    device: Annotated[str, typer.Option(help="Device to check support on.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Dtype to check support with.")] = "float32",
) -> None:
    """List registered attention variants, their kernels and support on this machine."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from attn import attention_info, create_attention, list_attention, list_kernels
    from attn.registry import plugin_errors
    from bench.config import list_presets

    _plugins(plugin)
    table = Table(title=f"attention variants (support on {device}, {dtype}: fwd / bwd)")
    for column in ("variant", "params (defaults)", "kernels: fwd/bwd support", "causal", "description"):
        table.add_column(column, overflow="fold")
    torch_dtype = getattr(torch, dtype)
    for name in list_attention():
        info = attention_info(name)
        cells = []
        try:
            module = create_attention(name, num_heads=8, head_dim=64)
            for kernel in info.kernels:
                marks = []
                for grad in (False, True):
                    why = module.supports(device, torch_dtype, False, grad, kernel=kernel)
                    marks.append("yes" if not why else "no")
                cells.append(f"{kernel}: {'/'.join(marks)}")
            auto = module.resolve_kernel(torch.device(device), torch_dtype, False, False)
            cells.append(f"auto -> {auto}")
        except Exception as err:
            cells.append(f"cannot build: {type(err).__name__}: {err}")
        params = ", ".join(f"{k}={v}" for k, v in info.params.items())
        table.add_row(name, params, "\n".join(cells), "yes" if info.supports_causal else "no",
                      info.description)
    console = Console()
    console.print(table)
    console.print(f"kernels: {', '.join(list_kernels())}")
    console.print(f"presets: {', '.join(list_presets())}")
    for name, err in plugin_errors().items():
        console.print(f"[red]plug-in {name} failed to load: {err}[/red]")


@app.command()
def sweep(
    config: Annotated[str, typer.Argument(help="YAML file or preset name (quick, scaling-cpu, scaling-gpu).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default runs/<name>).")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        help="Run only these variants (default params); repeatable; plug-ins welcome.")] = None,
    kernel: Annotated[list[str] | None, typer.Option(help="Kernels to run (auto or names); repeatable.")] = None,
    seq_len: Annotated[list[int] | None, typer.Option(help="Sequence lengths; repeatable.")] = None,
    pass_: Annotated[list[str] | None, typer.Option("--pass", help="Passes: fwd, bwd, fwd_bwd; repeatable.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed repeats per pass.")] = None,
    timeout_s: Annotated[float | None, typer.Option(help="Time limit per case (s).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda.")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, float16, bfloat16.")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads per case.")] = None,
    plugin: PluginOpt = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Skip finished cases (the default; kept for clarity).")] = True,
    overwrite: Annotated[bool, typer.Option(help="Discard previous results in --out first.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cases and exit.")] = False,
    plots: Annotated[bool, typer.Option(help="Write report.md and plots at the end.")] = True,
) -> None:
    """Run a sweep into a run directory (resumable: finished cases are skipped)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from bench.cases import expand_cases
    from bench.config import ConfigError, load_config, safe_name, with_overrides
    from bench.results import RESULTS_FILE, read_rows

    _plugins(plugin)
    try:
        cfg = load_config(config)
        overrides = {"variants": variant, "kernels": kernel, "seq_len": seq_len, "passes": pass_,
                     "repeats": repeats, "timeout_s": timeout_s, "device": device,
                     "dtype": dtype, "threads": threads}
        _check_choices(overrides)
        cfg = with_overrides(cfg, **{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in overrides.items()},
                             plugins=tuple(dict.fromkeys((*cfg.plugins, *(plugin or ())))))
    except ConfigError as err:
        _fail(str(err))
    run_dir = out or Path("runs") / safe_name(cfg.name)
    cases = expand_cases(cfg)
    if overwrite and (run_dir / RESULTS_FILE).exists() and not dry_run:
        (run_dir / RESULTS_FILE).unlink()
    done = {r["case_id"] for r in read_rows(run_dir)} if resume else set()
    console = Console(stderr=True)
    if dry_run:
        for i, case in enumerate(cases):
            mark = "done" if case.case_id in done else "todo"
            typer.echo(f"{i + 1:4d} {case.case_id} {mark} {case.describe()}")
        typer.echo(f"{len(cases)} cases, {sum(c.case_id in done for c in cases)} already done "
                   f"in {run_dir}")
        return
    from bench.sweep import run_sweep

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    statuses: dict[str, int] = {}
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("starting", total=None)

        def on_start(case, index, total):
            progress.update(task, total=total, completed=index,
                            description=f"[cyan]{escape(case.describe())}")

        def on_done(case, rows):
            progress.advance(task)
            for row in rows:
                statuses[row["status"]] = statuses.get(row["status"], 0) + 1
            if not console.is_terminal:  # logs (CI): one line per finished case
                done_n = int(progress.tasks[0].completed)
                states = ", ".join(f"{r['pass']} {r['status']}" for r in rows)
                console.print(f"[{done_n}/{progress.tasks[0].total}] {case.describe()}: {states}",
                              markup=False, highlight=False)

        run_sweep(cfg, run_dir, on_start=on_start, on_done=on_done)
        progress.update(task, description="done")
    summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "nothing new"
    console.print(f"{run_dir}: {summary} rows this run ({len(cases)} cases in the config)")
    if plots:
        _report_and_plot(run_dir, console)


def _check_choices(overrides: dict) -> None:
    from bench.config import DEVICES, DTYPES, PASSES, ConfigError

    for key, allowed in (("passes", PASSES), ("device", DEVICES), ("dtype", DTYPES)):
        value = overrides.get(key)
        for v in (value if isinstance(value, list) else [value] if value else []):
            if v not in allowed:
                raise ConfigError(f"option {key!r}: unknown value {v!r}; allowed values are {list(allowed)}")


def _report_and_plot(run_dir: Path, console) -> None:
    from bench.plots import plot_run
    from bench.report import build_report

    build_report(run_dir)
    try:
        paths = plot_run(run_dir)
    except ValueError as err:
        console.print(f"no plots: {err}")
        return
    console.print(f"wrote {run_dir / 'report.md'}, " + ", ".join(str(p) for p in paths))


@app.command()
def plot(run_dir: Annotated[Path, typer.Argument(help="Run directory written by sweep.")]) -> None:
    """Draw log-log time and memory against N (PNG and SVG in the run directory)."""
    from bench.plots import plot_run

    try:
        for path in plot_run(_run_dir(run_dir)):
            typer.echo(str(path))
    except ValueError as err:
        _fail(str(err), 1)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by sweep.")],
    points: Annotated[int, typer.Option(help="Fit exponents over this many largest ok N.")] = 4,
    fit_range: Annotated[list[str] | None, typer.Option(
        help="Also fit exponents over every N in LO:HI (repeatable), e.g. 4096:32768.",
        metavar="LO:HI")] = None,
) -> None:
    """Print scaling exponents, crossover lengths and largest N as markdown (also report.md)."""
    from bench.report import build_report

    ranges = []
    for text in fit_range or []:
        lo, _, hi = text.partition(":")
        if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) < int(hi)):
            _fail(f"--fit-range must be LO:HI with integers 0 < LO < HI (e.g. 4096:32768); got {text!r}", 2)
        ranges.append((int(lo), int(hi)))
    typer.echo(build_report(_run_dir(run_dir), points, tuple(ranges)))


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="Baseline run directory.")],
    run_b: Annotated[Path, typer.Argument(help="New run directory.")],
    fail_if_regression: Annotated[float | None, typer.Option(
        help="Exit 1 if any matching ok row is slower by more than PCT percent.",
        metavar="PCT")] = None,
) -> None:
    """Compare two runs row by row (time ratio B/A); optionally fail on a regression."""
    from bench.compare import compare_runs, regressions
    from bench.report import markdown_table

    table = compare_runs(_run_dir(run_a), _run_dir(run_b))
    if table.empty:
        _fail("the two runs have no matching ok rows", 1)
    cols = ["label", "kernel_requested", "pass", "seq_len", "time_a_ms", "time_b_ms", "change_pct"]
    typer.echo(markdown_table(table[cols]))
    if fail_if_regression is not None:
        bad = regressions(table, fail_if_regression)
        if len(bad):
            typer.secho(f"{len(bad)} row(s) slower by more than {fail_if_regression:g}%",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(1)
        typer.echo(f"no regression above {fail_if_regression:g}%")


@app.command()
def check(
    name: Annotated[str, typer.Argument(help="Registered or plug-in attention name.")],
    kernel: Annotated[list[str] | None, typer.Option(help="Kernels to check; repeatable (default all).")] = None,
    param: Annotated[list[str] | None, typer.Option(
        help="Variant parameter KEY=VALUE (YAML value); repeatable.")] = None,
    device: Annotated[str, typer.Option(help="Device.")] = "cpu",
    plugin: PluginOpt = None,
) -> None:
    """Run the conformance kit on a variant; non-zero exit with the reasons when it fails."""
    import yaml

    _plugins(plugin)
    params = None
    if param:
        params = {}
        for item in param:
            key, sep, value = item.partition("=")
            if not sep or not key:
                _fail(f"--param must be KEY=VALUE; got {item!r}")
            params[key] = yaml.safe_load(value)
    try:
        from attn.conformance import check_attention
    except ImportError as err:
        _fail(f"the conformance kit is not available: {err}", 1)
    try:
        result = check_attention(name, params=params, kernels=kernel, device=device)
    except ValueError as err:
        _fail(str(err))
    typer.echo(str(result))
    if not result.passed:
        for failure in result.failures:
            typer.secho(f"FAIL: {failure}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


def _mount_decoding() -> None:
    """``attn-bench decoding``: the KV-cache decoding and streaming benchmark (bench.decoding)."""
    from bench.decoding import main as decoding_main

    app.command("decoding")(decoding_main)


_mount_decoding()


if __name__ == "__main__":
    sys.exit(app())
