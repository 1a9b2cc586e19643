"""Helpers every command shares: one-line input errors, options, run directories."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from attn.validation import require_choice
from bench.cli.app import debug_enabled
from bench.engine.messages import cut

F = TypeVar("F", bound=Callable[..., Any])

PluginOpt = Annotated[
    list[str] | None,
    typer.Option("--plugin", metavar="MODULE|FILE.py",
                 help="Import this module, or this .py file, first (it registers attentions, "
                      "tasks, model kinds); repeatable."),
]


class UsageError(ValueError):
    """Bad command-line input; the message names the option and the allowed values."""


def fail(message: str, code: int = 2) -> None:
    """Print ``error: MESSAGE`` (cut to a readable length) and exit with ``code``."""
    typer.secho(f"error: {cut(message)}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


#: what ``user_errors`` turns into one line: input errors, not bugs
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
    PermissionError)


def user_errors(fn: F) -> F:
    """A command's input errors (:data:`USER_ERRORS`, a locked run) as one line, exit code 2; ``--debug`` re-raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from bench.engine.fsutil import RunLockedError  # lazy: CLI start-up

        try:
            return fn(*args, **kwargs)
        except (*USER_ERRORS, RunLockedError) as err:
            if debug_enabled():
                raise
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            fail(f"{message} (--debug shows the traceback)")

    return wrapper  # type: ignore[return-value]


def as_option(err: Any, option: str) -> UsageError:
    """A ``ConfigError`` about a config key, reworded for the option that set it (``--device: ...``)."""
    return UsageError(str(err).replace(f"config key {err.key!r}", option, 1))


def import_plugin_options(modules: list[str] | None) -> None:
    """Import the ``--plugin`` modules; a module that fails to import is a ``--plugin`` error."""
    from bench.engine.config import ConfigError, import_plugins  # lazy: CLI start-up

    try:
        import_plugins(tuple(modules or ()))
    except ConfigError as err:
        raise as_option(err, "--plugin") from None


def require_run_dir(path: Path, argument: str = "RUN_DIR", *, quality: bool = True) -> Path:
    """``path`` if it is a run directory (``quality``: a grid's or a pretrained run's too), else a ``UsageError``."""
    files = ("results.csv", "quality.csv", "pretrained.csv") if quality else ("results.csv",)
    if not any((path / f).is_file() for f in files):
        why = f"no {' or '.join(files)} in it" if path.is_dir() else "no such directory"
        raise UsageError(f"{argument} {path} is not a run directory ({why}); give a run "
                         "directory written by `attn-bench sweep`")
    return path


def gate_percent(fail_if_regression: float | None, abs_threshold_ms: float) -> float:
    """The regression rule's percentage (the default without ``--fail-if-regression``); both thresholds >= 0."""
    from bench.speed.compare import DEFAULT_REL_PCT  # lazy: as every command's imports

    for option, value, example in (("--fail-if-regression", fail_if_regression, "5 for 5%"),
                                   ("--abs-threshold-ms", abs_threshold_ms, "1")):
        if value is not None and not value >= 0:
            raise UsageError(f"{option}: must be a number >= 0 (e.g. {example}); got {value:g}")
    return DEFAULT_REL_PCT if fail_if_regression is None else fail_if_regression


def choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else a ``UsageError`` naming ``option`` (loads no torch)."""
    return require_choice(option, value, allowed, error=UsageError)


def check_device_option(device: str, option: str | None = "--device") -> None:
    """``device`` is usable here (cuda needs CUDA); ``option``: what set it (None: the config)."""
    from bench.engine.config import ConfigError, check_device  # lazy: CLI start-up

    try:
        check_device(device)
    except ConfigError as err:
        raise (as_option(err, option) if option else err) from None


def check_writable(directory: Path, option: str = "--out") -> None:
    """``directory`` exists (created if needed) and accepts files, else a ``UsageError``."""
    from bench.engine.fsutil import NotWritableError, require_writable  # lazy: CLI start-up

    try:
        require_writable(directory)
    except NotWritableError as err:
        raise as_option_dir(err, option) from None


def as_option_dir(err: Any, option: str = "--out") -> UsageError:
    """A :class:`bench.engine.fsutil.NotWritableError` as an error of ``option``."""
    return UsageError(f"{option}: {err}")


def make_console(*, stderr: bool = False) -> Any:
    """A rich console; off a terminal never wrapped at 80 columns, so a message stays one line ``grep`` finds."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=_UNWRAPPED_WIDTH)


#: the width a console that does not write to a terminal lays tables and bars out in
_UNWRAPPED_WIDTH = 120


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop a sweep cleanly, as Ctrl-C does."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
