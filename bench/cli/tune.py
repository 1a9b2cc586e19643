"""``attn-bench tune``: measure the kernels ``auto`` chooses between on this machine and write a tuning file;
``--evaluate``: judge ``auto`` with and without it; ``--show``: the file ``auto`` reads here, and why."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bench.cli.app import app
from bench.cli.common import UsageError, check_device_option, check_writable, user_errors

if TYPE_CHECKING:
    from attn.kernels.tuning import KernelTime  # lazy: CLI start-up

#: the subjects of the options' checks, as the options that set them
_OPTIONS = {"device": "--device", "dtype": "--dtype", "threads": "--threads", "seq_len": "--seq-len",
            "repeats": "--repeats", "kinds": "--kind", "variants": "--variant", "passes": "--pass",
            "tuning_path": "--out"}


def _named(err: ValueError) -> UsageError:
    """A check's error (``"seq_len: ..."``) reworded for the option that set it (``"--seq-len: ..."``)."""
    text = str(err)
    subject, sep, rest = text.partition(": ")
    return UsageError(f"{_OPTIONS[subject]}: {rest}" if sep and subject in _OPTIONS else text)


def _target(out: Path | None) -> Path:
    """Where the tuning file is: ``--out``, else ``$ATTN_BENCH_TUNING``, else the cache's default."""
    from attn.kernels.tuning import default_tuning_path, tuning_path  # lazy: CLI start-up

    return out if out is not None else (tuning_path() or default_tuning_path())


@app.command("tune")
@user_errors
def tune_command(
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Tuning file to write (or, with --evaluate and --show, to read); default: "
                            "$ATTN_BENCH_TUNING, else $XDG_CACHE_HOME/attn-bench/tuning.json.")] = None,
    device: Annotated[str, typer.Option(help="Device to measure (cpu, cuda).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Dtype (float32, float16, bfloat16, float64).")] = "float32",
    threads: Annotated[int | None, typer.Option(min=1, help="Torch threads (default: torch's).")] = None,
    seq_len: Annotated[list[int] | None, typer.Option(
        "--seq-len", min=1, help="Key lengths of the ladder (repeatable; default 256 512 1024 2048 4096, "
                                 "--quick 256 1024; --evaluate: the config's).")] = None,
    repeats: Annotated[int, typer.Option(min=5, help="Timed rounds per kernel (the median of these).")] = 5,
    kind: Annotated[list[str] | None, typer.Option(
        help="Kinds to tune (banded, biased, plain; repeatable; default all).")] = None,
    quick: Annotated[bool, typer.Option(
        help="One variant per kind, 256 and 1024 keys, no kernel that compiles per shape (1-2 minutes "
             "on 2 cores); with --evaluate: no kernel that compiles per shape.")] = False,
    evaluate: Annotated[bool, typer.Option(
        help="Time every kernel on a sweep config's cases and print how often auto is within 5% of the "
             "fastest, with its fixed table and with the tuning file.")] = False,
    config: Annotated[str, typer.Option(help="--evaluate: the sweep config (file or preset).")] = "quick",
    variant: Annotated[list[str] | None, typer.Option(
        help="--evaluate: only these variants of the config (repeatable).")] = None,
    pass_: Annotated[list[str] | None, typer.Option(
        "--pass", help="--evaluate: only these passes (fwd, bwd, fwd_bwd; repeatable).")] = None,
    eval_out: Annotated[Path | None, typer.Option(
        "--eval-out", help="--evaluate: also write every case and the shares here (JSON).")] = None,
    show: Annotated[bool, typer.Option(
        help="Print the tuning auto uses here for --device/--dtype/--threads, or why it uses none.")] = False,
) -> None:
    """Tune kernel="auto" for this machine: time the kernels it chooses between per kind, pass and length,
    derive its orders and short-call limits, and write them to a tuning file that auto reads
    (docs/kernels.md, "Tuning auto for this machine")."""
    evaluate_only = {"--config": config != "quick", "--variant": bool(variant), "--pass": bool(pass_),
                     "--eval-out": eval_out is not None}
    wrong = [name for name, given in evaluate_only.items() if given and not evaluate]
    if wrong:
        raise UsageError(f"{wrong[0]}: only with --evaluate")
    if evaluate and show:
        raise UsageError("--show: not with --evaluate; give one of them")
    check_device_option(device)
    path = _target(out)
    try:
        if show:
            _show(path, device, dtype, threads)
        elif evaluate:
            _evaluate(path, config, tuple(variant or ()), tuple(seq_len or ()), tuple(pass_ or ()), repeats,
                      threads, quick, eval_out)
        else:
            _tune(path, device, dtype, threads, tuple(seq_len or ()), repeats, tuple(kind or ()), quick)
    except UsageError:
        raise
    except ValueError as err:
        raise _named(err) from None


def _tune(path: Path, device: str, dtype: str, threads: int | None, seq_len: tuple[int, ...], repeats: int,
          kinds: tuple[str, ...], quick: bool) -> None:
    from bench.speed.tune import (  # lazy: CLI start-up
        LENGTHS,
        QUICK_LENGTHS,
        TUNED_KINDS,
        TuneOptions,
        describe_orders,
        tune,
        write_tuning,
    )

    options = TuneOptions(device=device, dtype=dtype, threads=threads, repeats=repeats, quick=quick,
                          seq_len=seq_len or (QUICK_LENGTHS if quick else LENGTHS), kinds=kinds or TUNED_KINDS)
    check_writable(path.parent)
    table = tune(options, typer.echo)
    write_tuning(path, table)
    typer.echo(f"\nauto's tuned orders ({device}, {dtype}, {table.threads} threads):")
    for line in describe_orders(table):
        typer.echo(f"  {line}")
    typer.echo(f"wrote {path}")
    _warn_noisy(table.times)
    _warn_unread(path)


def _warn_noisy(times: Sequence[KernelTime]) -> None:
    """Say so when the repeats of many kernels spread past the suite's noise threshold (a busy machine)."""
    from bench.speed.noise import DEFAULT_THRESHOLD  # lazy: CLI start-up

    noisy = [t for t in times if t.spread > DEFAULT_THRESHOLD]
    if noisy:
        typer.secho(f"note: {len(noisy)} of {len(times)} timings spread over {DEFAULT_THRESHOLD:.0%} (IQR / median): "
                    "the machine was busy, and the table follows its contention; tune again on a quiet machine",
                    fg=typer.colors.YELLOW, err=True)


def _warn_unread(path: Path) -> None:
    """Say so when ``auto`` will not read ``path`` (another file named, or tuning turned off)."""
    from attn.kernels.tuning import TUNING_ENV, tuning_path  # lazy: CLI start-up

    read = tuning_path()
    if read is None or read.resolve() != path.resolve():
        where = f"{TUNING_ENV} is off" if read is None else f"auto reads {read}"
        typer.secho(f"note: {where}; set {TUNING_ENV}={path} for auto to use this file",
                    fg=typer.colors.YELLOW, err=True)


def _evaluate(path: Path, config: str, variants: tuple[str, ...], seq_len: tuple[int, ...],
              passes: tuple[str, ...], repeats: int, threads: int | None, quick: bool,
              eval_out: Path | None) -> None:
    from bench.engine.fsutil import atomic_write_json  # lazy: CLI start-up
    from bench.speed.tune_eval import EvalOptions, evaluate, summary_lines  # lazy: CLI start-up

    options = EvalOptions(tuning_path=path, config=config, variants=variants, seq_len=seq_len, passes=passes,
                          repeats=repeats, threads=threads, no_compile=quick)
    if eval_out is not None:
        check_writable(eval_out.parent, "--eval-out")
    result = evaluate(options, typer.echo)
    typer.echo("")
    for line in summary_lines(result):
        typer.echo(line)
    if eval_out is not None:
        atomic_write_json(eval_out, result.to_json())
        typer.echo(f"wrote {eval_out}")


def _show(path: Path, device: str, dtype: str, threads: int | None) -> None:
    from attn.kernels.tuning import default_loader, tuning_path  # lazy: CLI start-up

    tuning = default_loader().tuning(path, device, dtype, threads)
    reads = tuning_path()
    typer.echo(f"auto reads: {reads if reads is not None else 'nothing (ATTN_BENCH_TUNING is off)'}")
    typer.echo(f"{path}: {tuning.source}" + (f" ({tuning.reason})" if tuning.reason else ""))
    if not path.exists():
        typer.echo("  no such file: auto keeps its fixed table (docs/kernels.md)")
    for (kind, pass_name), order in sorted(tuning.orders.items()):
        short = f"; below {order.short_keys} keys: {', '.join(order.short)}" if order.short_keys else ""
        typer.echo(f"  {kind:7} {pass_name:8} {', '.join(order.long)}{short}")
