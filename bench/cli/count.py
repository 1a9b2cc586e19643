"""``attn-bench count``: instructions per kernel call at given lengths (callgrind)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import UsageError, check_writable, user_errors
from bench.counting.options import DTYPES, CountOptions


@app.command("count")
@user_errors
def count_command(
    name: Annotated[str, typer.Argument(help="Registered attention name.")],
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/count"),
    kernel: Annotated[str, typer.Option(help="Kernel to count (default: auto's choice).")] = "auto",
    param: Annotated[list[str] | None, typer.Option(
        help="Variant parameter KEY=VALUE (YAML value); repeatable.")] = None,
    seq_len: Annotated[list[int] | None, typer.Option(
        "--seq-len", min=1, help="Sequence lengths (repeatable; default 256, 512 and 1024).")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Batch size.")] = CountOptions.batch,
    heads: Annotated[int, typer.Option(min=1, help="Heads.")] = CountOptions.heads,
    head_dim: Annotated[int, typer.Option(min=1, help="Head dimension.")] = CountOptions.head_dim,
    dtype: Annotated[str, typer.Option(help=f"Dtype ({', '.join(DTYPES)}).")] = CountOptions.dtype,
    causal: Annotated[bool, typer.Option(help="Causal calls.")] = False,
    calls: Annotated[int, typer.Option(min=1, help="Counted calls per length.")] = CountOptions.calls,
    warmup: Annotated[int, typer.Option(min=0, help="Uncounted calls first.")] = CountOptions.warmup,
    timeout_s: Annotated[float, typer.Option(
        help="Time limit of the counted process (s); callgrind runs Python ~50x slower.")] = 3600.0,
) -> None:
    """Count the instructions of one kernel's call at each length under Valgrind's callgrind
    (deterministic, unlike wall-clock time on a shared machine); refuses, naming what is
    missing, where no counter works."""
    from bench.cli.variants import _attention_info, _check_params  # lazy: CLI start-up
    from bench.counting.run import run_count  # lazy: CLI start-up

    info = _attention_info(name)
    if kernel != "auto" and kernel not in info.kernels:
        raise UsageError(f"--kernel: {name!r} has no kernel {kernel!r}; allowed values are "
                         f"{['auto', *info.kernels]}")
    params = _check_params(name, info, param) or {}
    options = CountOptions(variant=name, params=params, kernel=kernel,
                           seq_len=tuple(seq_len) if seq_len else CountOptions.seq_len, batch=batch, heads=heads,
                           head_dim=head_dim, dtype=dtype, causal=causal, calls=calls, warmup=warmup,
                           timeout_s=timeout_s)
    check_writable(out)
    run_count(options, out)
