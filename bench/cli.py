"""The ``attn-bench`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(help="Long-sequence attention benchmark suite.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """Benchmark attention variants: list, sweep, plot, report, compare, check."""


@app.command("list")
def list_command() -> None:
    """List registered attention variants and their kernels."""
    from attn import attention_info, list_attention

    for name in list_attention():
        info = attention_info(name)
        typer.echo(f"{name:16s} kernels={','.join(info.kernels):28s} {info.description}")


if __name__ == "__main__":
    app()
