"""``attn-bench reproduce``: re-measure a committed run's ratios here and say which hold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import UsageError, require_run_dir, user_errors

#: how many times rows flagged noisy are measured again before they are left unjudged
RETRIES = 2


@app.command()
@user_errors
def reproduce(
    run_dir: Annotated[Path, typer.Argument(help="A committed speed run (results/NAME).")],
    sample: Annotated[int | None, typer.Option(
        min=1, help="Re-measure K of its lengths (spread evenly, the longest kept); default all.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Where the new run goes (default runs/reproduce-NAME); rerunning resumes it.")] = None,
    tolerance: Annotated[float, typer.Option(
        min=0.0, help="A ratio holds when the quartile ranges overlap or the medians differ by "
                      "at most this fraction.")] = 0.10,
) -> None:
    """Re-measure a speed run's interleaved ratios on this machine, interleaved as the original,
    and print each beside the committed one; exit 1 when a headline figure (the longest length
    of each pattern, kernel and pass) does not hold. Writes reproduce.md into --out."""
    from bench.engine.provenance import cpu_summary, environment  # lazy: CLI start-up
    from bench.engine.results import read_env  # lazy: CLI start-up
    from bench.runner import load_run, run  # lazy: CLI start-up
    from bench.speed import reproduce as repro  # lazy: CLI start-up
    from bench.speed.results import load_results  # lazy: CLI start-up

    require_run_dir(run_dir)
    if not (run_dir / "sweep.json").exists():
        raise UsageError(f"RUN_DIR: {run_dir} is not a speed sweep (no sweep.json)")
    committed = load_results(run_dir)
    lengths = repro.sampled_lengths(committed, sample)
    if not lengths:
        raise UsageError(f"RUN_DIR: {run_dir} has no ratios of kernels timed together to reproduce")
    raw = repro.saved_config(run_dir)
    target = out or Path("runs") / f"reproduce-{raw['name']}"
    config = load_run(raw, {"seq_len": list(lengths)})
    run(config, target)
    for _ in range(RETRIES):  # rows measured under contention are measured again, as --retry-noisy does
        if not load_results(target).noisy.any():
            break
        run(config, target, retry_noisy=True)
    table = repro.compare_ratios(committed, load_results(target), tolerance)
    here = cpu_summary(environment(config.device, config.threads, probe=False))
    committed_on = "; ".join(sorted({cpu_summary(s) for s in read_env(run_dir)} - {""}))
    lines = [f"# Reproducing `{run_dir}` (N = {', '.join(map(str, lengths))})", "",
             *repro.reproduction_lines(table, committed_on, here), ""]
    (target / "reproduce.md").write_text("\n".join(lines))
    typer.echo("\n".join(lines))
    failed = repro.failed_headlines(table)
    if len(failed):
        typer.echo(f"{len(failed)} headline figure(s) do not hold here", err=True)
        raise typer.Exit(1)
