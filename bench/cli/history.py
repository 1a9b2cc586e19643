"""``attn-bench history``: the history across run directories, its page and its gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import gate_percent, user_errors


@app.command()
@user_errors
def history(
    results_dirs: Annotated[list[Path], typer.Argument(
        help="Folders searched recursively for run directories (results.csv or quality.csv).",
        metavar="RESULTS_DIR...")],
    out: Annotated[Path | None, typer.Option(
        help="Where history.html and its store history.sqlite go (default: the first RESULTS_DIR).")] = None,
    fail_if_regression: Annotated[float | None, typer.Option(
        help="Exit 1 when the newest step of any series (a figure of one case on one machine, "
             "between its two latest commits) is worse by more than PCT percent, the absolute "
             "threshold and the noise (the rule of attn-bench compare), newly failing or broken.",
        metavar="PCT")] = None,
    abs_threshold_ms: Annotated[float, typer.Option(
        help="A time change counts only when larger than this many ms (memory: 1 MiB).", metavar="MS")] = 1.0,
) -> None:
    """Gather every run under RESULTS_DIR... into one history (keyed by commit, commit time,
    machine and case), write history.html (each figure against commits, one series per
    machine) and mark the steps that moved beyond their spread."""
    from bench.engine.markdown import markdown_table  # lazy: CLI start-up
    from bench.html.history import build_history  # lazy: CLI start-up

    rel_pct = gate_percent(fail_if_regression, abs_threshold_ms)
    found = build_history(results_dirs, out or results_dirs[0], rel_pct, abs_threshold_ms)
    counts = found.counts
    typer.echo(f"{counts['runs']} runs ({counts['read']} read, {counts['kept']} unchanged), "
               f"{found.rows.commit_sha.nunique()} commits, {len(found.steps)} steps between commits")
    typer.echo(f"page: {found.page}")
    newest = found.newest_regressions
    if fail_if_regression is None:
        return
    if len(newest):
        typer.echo(markdown_table(newest[["class", "figure", "case", "machine", "commit_a", "commit_b",
                                          "value_a", "value_b", "noise"]]))
        typer.secho(f"regression gate failed: the newest step of {len(newest)} series is a regression",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    typer.echo(f"no regression: no series' newest step is worse by more than {rel_pct:g}% and the noise")
