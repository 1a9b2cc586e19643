"""The ``attn-bench`` application: the typer app, one-line errors and the entry point.

Bad input (a config, an option, a run directory) is one line naming the argument and the
allowed values, exit code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import sys
import warnings
from typing import Annotated, Any

import typer
import typer.core


def _click() -> Any:
    """The click package typer runs on: newer typer ships its own copy (``typer._click``),
    older typer uses click itself. Its context and exception classes come from there."""
    try:
        from typer import _click as click_module
    except ImportError:
        import click as click_module
    return click_module


class OneLineErrorsGroup(typer.core.TyperGroup):
    """The command group. Click's own usage errors (a value out of range, a value of the
    wrong type, a missing argument, an unknown option) become one line ``error: ...`` with
    exit code 2, like the commands' input errors (``--debug``: the traceback)."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the CLI; exits with the command's code (0, 1 for a failed check or gate, 2 for
        bad input, 130 when interrupted)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        click = _click()
        no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warning
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except no_args as err:  # bare `attn-bench`: the help
            err.show()
            sys.exit(err.exit_code)
        except click.exceptions.ClickException as err:
            ctx = getattr(err, "ctx", None)
            if debug_enabled(ctx):
                raise
            typer.secho(f"error: {_click_message(err, ctx)}", fg=typer.colors.RED, err=True)
            sys.exit(err.exit_code)
        except (typer.Abort, *_abort_classes(click)):
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: Any = None, line: str | None = None) -> None:
    """A warning as one line ``warning: ...`` on stderr (a damaged row, idle Ray nodes), not
    Python's two lines naming the source file that raised it."""
    from bench.engine.messages import cut  # lazy: CLI start-up

    text = " ".join(str(message).split())
    typer.secho(f"warning: {cut(text)}", fg=typer.colors.YELLOW, err=True)


def _abort_classes(click: Any) -> tuple[type[BaseException], ...]:
    """Click's ``Abort`` where the click in use has one (typer's own copy does not)."""
    abort = getattr(click.exceptions, "Abort", None)
    return (abort,) if abort is not None else ()


def _click_message(err: Any, ctx: Any) -> str:
    """A click error on one line, pointing at the command's ``--help``."""
    message = " ".join(err.format_message().split())
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


app = typer.Typer(help="Long-sequence attention benchmark suite.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=OneLineErrorsGroup)


def debug_enabled(ctx: Any = None) -> bool:
    """Whether the root option ``--debug`` was given (``ctx``: default the current context)."""
    ctx = ctx or _click().globals.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


@app.callback()
def main_callback(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]
    = False,
) -> None:
    """Benchmark attention variants: list, sweep, plot, report, compare, check."""


def main() -> None:
    """Console-script entry point."""
    app()
