"""``attn-bench approx-error``: approximation error against exact attention, by length and size."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import PluginOpt, check_writable, import_plugin_options, user_errors


@app.command("approx-error")
@user_errors
def approx_error_command(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/approx-error"),
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="NAME or NAME:PARAM=V1,V2,... (repeatable; default nystrom:num_landmarks=16,64,256, "
                          "performer:num_features=16,64,256, linformer:proj_len=16,64,256, linear_attention).")] = None,
    length: Annotated[list[int] | None, typer.Option(
        "--length", min=1, help="Sequence lengths (repeatable; default 1024 to 65536, doubling).")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Batch size of the inputs.")] = 1,
    heads: Annotated[int, typer.Option(min=1, help="Heads of the inputs.")] = 2,
    head_dim: Annotated[int, typer.Option(min=1, help="Head dimension of the inputs.")] = 32,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the inputs and of learned parameters.")] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    plugin: PluginOpt = None,
) -> None:
    """Error of approximate attentions against exact full attention as N and their size grow."""
    from bench.approx.error import (  # lazy: CLI start-up
        DEFAULT_LENGTHS,
        DEFAULT_SWEEPS,
        ApproxOptions,
        parse_sweep,
        run_approx_error,
    )

    import_plugin_options(plugin)  # before the names are checked: it registers attentions
    sweeps = tuple(parse_sweep(s) for s in variant) if variant else DEFAULT_SWEEPS
    options = ApproxOptions(sweeps=sweeps, lengths=tuple(length) if length else DEFAULT_LENGTHS, batch=batch,
                            heads=heads, head_dim=head_dim, seed=seed, threads=threads)
    check_writable(out)
    run_approx_error(options, out)
