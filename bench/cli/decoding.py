"""``attn-bench decoding``: KV-cache decoding and streaming benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import (
    check_writable,
    user_errors,
)


@app.command("decoding")
@user_errors
def decoding_command(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/decoding"),
    context: Annotated[list[int] | None, typer.Option(
        "--context", min=1, help="Prompt lengths (repeatable; default 1024 and 4096).")] = None,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per call.")] = 32,
    attention: Annotated[list[str] | None, typer.Option(
        "--attention", help="Decoder attentions, causal ones only (repeatable; default full).")] = None,
    window: Annotated[int, typer.Option(min=0, help="Window of banded attentions.")] = 256,
    d_model: Annotated[int, typer.Option(min=1, help="Model width.")] = 256,
    num_heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = 4,
    num_layers: Annotated[int, typer.Option(min=1, help="Layers.")] = 4,
    d_ff: Annotated[int, typer.Option(min=1, help="Feed-forward width.")] = 1024,
    vocab_size: Annotated[int, typer.Option(min=2, help="Vocabulary size.")] = 256,
    stream_window: Annotated[list[int] | None, typer.Option(
        "--stream-window", min=1, help="Streaming windows (repeatable; default 256, 1024).")] = None,
    stream_layers: Annotated[list[int] | None, typer.Option(
        "--stream-layers", min=1, help="Streaming encoder depths (repeatable; default 1, 2).")] = None,
    stream_steps: Annotated[int, typer.Option(min=1, help="Streaming steps per repeat.")] = 32,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats (median).")] = 3,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
) -> None:
    """Measure decoding tokens/s with and without the KV cache, and streaming step time."""
    from bench.decoding import check_arguments, run_decoding_benchmark

    arguments = dict(context=context, new_tokens=new_tokens, attention=attention, window=window,
                     d_model=d_model, num_heads=num_heads, num_layers=num_layers, d_ff=d_ff,
                     vocab_size=vocab_size, stream_window=stream_window,
                     stream_layers=stream_layers, stream_steps=stream_steps, repeats=repeats,
                     threads=threads)
    check_arguments(**arguments)
    check_writable(out)
    run_decoding_benchmark(out=out, **arguments)


