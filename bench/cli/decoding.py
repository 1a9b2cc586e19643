"""``attn-bench decoding``: KV-cache decoding and streaming benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.app import app
from bench.cli.common import PluginOpt, check_device_option, check_writable, import_plugin_options, user_errors
from bench.decoding.options import DecodingOptions as Defaults


def _listed(values: tuple) -> str:
    return " and ".join(map(str, values))


@app.command("decoding")
@user_errors
def decoding_command(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/decoding"),
    benchmark: Annotated[list[str] | None, typer.Option(
        help=f"Benchmarks to run (repeatable; default {_listed(Defaults.benchmark)}).")] = None,
    context: Annotated[list[int] | None, typer.Option(
        min=1, help=f"Prompt lengths (repeatable; default {_listed(Defaults.context)}).")] = None,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per call.")] = Defaults.new_tokens,
    attention: Annotated[list[str] | None, typer.Option(
        help=f"Decoder attentions, causal ones only (repeatable; default {_listed(Defaults.attention)}).")] = None,
    window: Annotated[int, typer.Option(min=0, help="Window of banded attentions.")] = Defaults.window,
    d_model: Annotated[int, typer.Option(min=1, help="Model width.")] = Defaults.d_model,
    num_heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = Defaults.num_heads,
    num_kv_heads: Annotated[list[int] | None, typer.Option(
        min=1, help="Key/value heads of the decoder, each measured (grouped-query attention; must divide "
                    "--num-heads; repeatable; default --num-heads).")] = None,
    num_layers: Annotated[int, typer.Option(min=1, help="Layers.")] = Defaults.num_layers,
    d_ff: Annotated[int, typer.Option(min=1, help="Feed-forward width.")] = Defaults.d_ff,
    vocab_size: Annotated[int, typer.Option(min=2, help="Vocabulary size.")] = Defaults.vocab_size,
    stream_window: Annotated[list[int] | None, typer.Option(
        min=1, help=f"Streaming windows (repeatable; default {_listed(Defaults.stream_window)}).")] = None,
    stream_layers: Annotated[list[int] | None, typer.Option(
        min=1, help=f"Streaming encoder depths (repeatable; default {_listed(Defaults.stream_layers)}).")] = None,
    stream_steps: Annotated[int, typer.Option(min=1, help="Streaming steps per repeat.")] = Defaults.stream_steps,
    repeats: Annotated[int, typer.Option(
        min=1, help="Timed repeats (median; streaming: interleaved rounds).")] = Defaults.repeats,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    device: Annotated[str, typer.Option(
        help="Device the models run and are timed on (cpu, cuda).")] = Defaults.device,
    plugin: PluginOpt = None,
) -> None:
    """Measure decoding tokens/s with and without the KV cache, and streaming step time."""
    from bench.decoding.benchmark import check_attentions, run_decoding_benchmark  # lazy: CLI start-up
    from bench.html.report import write_report_html  # lazy: CLI start-up

    options = Defaults.from_given(
        benchmark=benchmark, context=context, new_tokens=new_tokens, attention=attention, window=window,
        d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads, num_layers=num_layers, d_ff=d_ff,
        vocab_size=vocab_size, stream_window=stream_window, stream_layers=stream_layers, stream_steps=stream_steps,
        repeats=repeats, threads=threads, device=device)
    check_device_option(device)
    import_plugin_options(plugin)  # before the names are checked: it registers attentions
    check_attentions(options)
    check_writable(out)
    run_decoding_benchmark(options, out)
    typer.echo(f"page: {write_report_html(out)}")


@app.command("decoding-step")
@user_errors
def decoding_step_command(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/decoding-step"),
    attention: Annotated[list[str] | None, typer.Option(
        "--attention", help="Decoder attentions, causal ones only (repeatable; default full).")] = None,
    context: Annotated[list[int] | None, typer.Option(
        "--context", min=1, help="Context lengths (repeatable; default 1024, 4096, 16384, 32768).")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Tokens timed per context per repeat.")] = 16,
    repeats: Annotated[int, typer.Option(min=1, help="Repeats (contexts interleaved in each).")] = 7,
    num_layers: Annotated[int, typer.Option(min=1, help="Layers.")] = 2,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    plugin: PluginOpt = None,
) -> None:
    """Time per generated token against the context length (KV cache or decoding state)."""
    from bench.decoding.benchmark import check_decoder_attention  # lazy: CLI start-up
    from bench.decoding.step import StepOptions, run_decoding_step  # lazy: CLI start-up

    given = {"attention": tuple(attention) if attention else None, "context": tuple(context) if context else None}
    options = StepOptions(**{k: v for k, v in given.items() if v is not None}, steps=steps, repeats=repeats,
                          num_layers=num_layers, threads=threads)
    import_plugin_options(plugin)  # before the names are checked: it registers attentions
    for spec in options.attention:
        check_decoder_attention(spec, 0, max(options.context) + 1, {"num_layers": num_layers})
    check_writable(out)
    run_decoding_step(options, out)
