"""``attn-bench plot``, ``report`` and ``compare``: reading run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import (
    PluginOpt,
    UsageError,
    fail,
    gate_percent,
    import_plugin_options,
    require_run_dir,
    user_errors,
)


@app.command()
@user_errors
def plot(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory written by sweep (a speed sweep or a training grid).")] = None,
    patterns: Annotated[bool, typer.Option(
        "--patterns", help="Also draw every registered variant's allowed (query, key) pairs at a "
                           "small N (into RUN_DIR, or --out).")] = False,
    out: Annotated[Path | None, typer.Option(help="Where --patterns writes without RUN_DIR.")] = None,
    plugin: PluginOpt = None,
) -> None:
    """Draw a run's figures (PNG and SVG in the run directory): scaling curves of a speed
    sweep; the quality/speed Pareto front, recall by distance and bits per byte by length of
    a training grid."""
    from bench.pretrained.report import is_pretrained_run, plot_pretrained_run  # lazy: CLI start-up
    from bench.quality.plots import plot_patterns, plot_quality_run  # lazy: CLI start-up
    from bench.quality.report import is_quality_run  # lazy: CLI start-up
    from bench.speed.plots import plot_run  # lazy: CLI start-up

    if run_dir is None and not patterns:
        raise UsageError("RUN_DIR: give a run directory, or --patterns (with --out DIR)")
    import_plugin_options(plugin)  # its variants are drawn, its tasks' figures found
    paths = []
    if run_dir is not None:
        require_run_dir(run_dir)
        if is_pretrained_run(run_dir):
            paths += plot_pretrained_run(run_dir)
        else:
            paths += plot_quality_run(run_dir) if is_quality_run(run_dir) else plot_run(run_dir)
    if patterns:
        paths += plot_patterns(run_dir or out or Path("."))
    for path in paths:
        typer.echo(str(path))


def _parse_ranges(texts: list[str] | None) -> tuple[tuple[int, int], ...]:
    ranges = []
    for text in texts or []:
        lo, _, hi = text.partition(":")
        if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) < int(hi)):
            raise UsageError(f"--fit-range must be LO:HI with integers 0 < LO < HI (e.g. "
                             f"4096:32768); got {text!r}")
        ranges.append((int(lo), int(hi)))
    return tuple(ranges)


@app.command()
@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by sweep.")],
    points: Annotated[int, typer.Option(min=2, help="Fit exponents over this many largest ok N.")] = 4,
    fit_range: Annotated[list[str] | None, typer.Option(
        help="Also fit exponents over every N in LO:HI (repeatable), e.g. 4096:32768.",
        metavar="LO:HI")] = None,
    plugin: PluginOpt = None,
) -> None:
    """Print a run's report as markdown (also report.md; summary.md of a decoding run) and
    write its page report.html beside it: scaling exponents, crossovers, interleaved ratios
    of a speed sweep; the quality table of a training grid; a decoding run's summary."""
    from bench.decoding.results import SUMMARY_FILE  # lazy: CLI start-up
    from bench.html.report import run_kind, write_report_html  # lazy: CLI start-up
    from bench.pretrained.report import build_pretrained_report  # lazy: CLI start-up
    from bench.quality.report import build_quality_report  # lazy: CLI start-up
    from bench.speed.report import build_report  # lazy: CLI start-up

    ranges = _parse_ranges(fit_range)
    import_plugin_options(plugin)  # a plug-in task's tables
    require_run_dir(run_dir)
    kind = run_kind(run_dir)
    if kind == "quality":
        typer.echo(build_quality_report(run_dir))
    elif kind == "pretrained":
        typer.echo(build_pretrained_report(run_dir))
    elif kind == "decoding":
        summary = run_dir / SUMMARY_FILE
        typer.echo(summary.read_text(encoding="utf-8") if summary.is_file() else
                   f"(no {SUMMARY_FILE} in {run_dir}: the page has the rows)")
    else:
        typer.echo(build_report(run_dir, points, ranges))
    typer.echo(f"page: {write_report_html(run_dir)}", err=True)


@app.command()
@user_errors
def compare(
    run_a: Annotated[Path, typer.Argument(help="Baseline run directory.")],
    run_b: Annotated[Path, typer.Argument(help="New run directory.")],
    fail_if_regression: Annotated[float | None, typer.Option(
        help="Regression gate: exit 1 on any broken, worse, lost or newly failing case, or when "
             "no case is ok in both runs. Broken: a damaged row, or an ok row without a finite "
             "time. Worse: B slower than A by more than PCT percent of A's time, "
             "more than --abs-threshold-ms and more than the noise (half of A's IQR plus half "
             "of B's). Without it the classes use 5%, and the exit code is 0 unless no case is ok "
             "in both runs (1).",
        metavar="PCT")] = None,
    abs_threshold_ms: Annotated[float, typer.Option(
        help="A time change counts (worse or better) only when larger than this many ms.",
        metavar="MS")] = 1.0,
) -> None:
    """Compare two runs case by case; with --fail-if-regression, a gate for CI.

    Rows match on (label, kernel_requested, seq_len, batch, heads, head_dim, dtype, device,
    causal, pass). Each case is broken (a damaged row, or ok without a finite time), newly
    failing (ok in A, not in B), lost (in A only), worse, better, fixed (ok in B only), new
    (in B only) or unchanged. Worse (better): B slower
    (faster) than A by more than all of --abs-threshold-ms, PCT percent of A's time and the
    noise (half of A's IQR plus half of B's). Prints the count of each class and a table of
    every case that is not unchanged.
    """
    from bench.engine.markdown import markdown_table  # lazy: CLI start-up
    from bench.speed import compare as rule  # lazy: CLI start-up

    rel_pct = gate_percent(fail_if_regression, abs_threshold_ms)
    table = rule.classify_runs(require_run_dir(run_a, "RUN_A", quality=False),
                               require_run_dir(run_b, "RUN_B", quality=False), rel_pct, abs_threshold_ms)
    typer.echo(f"{rule.summary_line(table)} (a time change counts beyond {rel_pct:g}%, "
               f"{abs_threshold_ms:g} ms and the noise)")
    note = rule.machine_note(run_a, run_b)
    if note:
        typer.echo(note)
    changed = rule.changed_cases(table)
    if len(changed):
        typer.echo(markdown_table(changed))
    if fail_if_regression is None:
        if rule.compared_count(table) == 0:
            fail("nothing to compare: no case is ok in both runs", 1)
        return
    reasons = rule.gate_failures(table)
    if reasons:
        typer.secho(f"regression gate failed: {'; '.join(reasons)}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    typer.echo(f"no regression: no case worse by more than {rel_pct:g}% and {abs_threshold_ms:g} "
               "ms, none broken, lost or newly failing")


