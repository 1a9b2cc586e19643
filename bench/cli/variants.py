"""``attn-bench list`` and ``check``: the registered variants, tasks and model kinds; the conformance kit."""

from __future__ import annotations

import textwrap
import time
from typing import Annotated, Any

import typer

from bench.cli.app import app
from bench.cli.common import PluginOpt, UsageError, check_device_option, choice, import_plugin_options, user_errors

#: the width ``attn-bench list`` lays its text out in: readable in an 80-column terminal
LIST_WIDTH = 80


@app.command("list")
@user_errors
def list_command(
    plugin: PluginOpt = None,
    device: Annotated[str, typer.Option(help="Device to check support on (cpu, cuda).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Dtype to check support with.")] = "float32",
) -> None:
    """List registered attention variants (their kernels and support on this machine), quality
    tasks and model kinds, and the presets."""
    import torch

    from attn import AttentionCall, attention_info, create_attention, list_attention, list_kernels  # lazy: CLI start-up
    from attn.registry import plugin_errors  # lazy: CLI start-up
    from bench.engine.config import DEVICES, DTYPES, list_config_presets  # lazy: CLI start-up
    from bench.quality.settings import list_task_presets  # lazy: CLI start-up
    from models import list_models  # lazy: CLI start-up

    choice("--device", device, DEVICES)
    choice("--dtype", dtype, DTYPES)
    import_plugin_options(plugin)
    lines = [f"attention variants (kernels: forward/backward support on {device}, {dtype})", ""]
    torch_dtype = getattr(torch, dtype)
    for name in list_attention():
        info = attention_info(name)
        cells = []
        try:
            module = create_attention(name, num_heads=8, head_dim=64)
            for kernel in info.kernels:  # forward, then with gradients; any lengths, no key_mask
                marks = ["no" if module.not_supported_reasons(AttentionCall(device, torch_dtype, False, grad),
                                                              kernel=kernel) else "yes" for grad in (False, True)]
                cells.append(f"{kernel} {'/'.join(marks)}")
            try:
                auto = auto_by_length(module, device, torch_dtype)
            except NotImplementedError as err:
                auto = f"auto -> none ({err})"
        except Exception as err:
            cells, auto = [], f"cannot build: {type(err).__name__}: {err}"
        params = ", ".join(f"{k}={v}" for k, v in info.params.items()) or "none"
        lines += _wrapped(f"{name}: ", " ".join(str(info.description).split()), "    ")
        lines += _wrapped("  params:  ", params, " " * 11)
        lines += _wrapped("  kernels: ", ", ".join(cells), " " * 11)
        lines += _wrapped("  auto:    ", auto.removeprefix("auto -> "), " " * 11)
        lines += [f"  causal:  {'yes' if info.supports_causal else 'no'}",
                  f"  GQA:     {'yes' if info.supports_gqa else 'no'} (k, v with fewer heads than q)", ""]
    lines += _wrapped("kernels: ", ", ".join(list_kernels()), "  ")
    lines += ["", *_tasks_lines(), ""]
    lines += _wrapped("model kinds: ", ", ".join(list_models()), "  ")
    lines += _wrapped("config presets (attn-bench sweep NAME): ", ", ".join(list_config_presets()), "  ")
    lines += _wrapped("task presets (--preset, a grid's preset): ", ", ".join(list_task_presets()), "  ")
    typer.echo("\n".join(lines))
    for name, err in plugin_errors().items():
        typer.secho(f"plug-in {name} failed to load: {err}", fg=typer.colors.RED)


def _auto_picks(module: Any, device: str, dtype: Any, grad: bool) -> str:
    """What ``auto`` runs for ``module``: a kernel, or one below the short-call limit and one from it."""
    from attn import AttentionCall  # lazy: CLI start-up
    from attn.kernels.auto import short_keys  # lazy: CLI start-up

    def pick(n: int | None) -> str:
        return module.resolve_kernel(AttentionCall(device, dtype, False, grad, n, n))

    limit = short_keys(module.pattern(), device, dtype, grad)
    if limit is None or pick(limit - 1) == pick(limit):
        return pick(limit)
    return f"{pick(limit - 1)} for N < {limit}, {pick(limit)} from N = {limit}"


def auto_by_length(module: Any, device: str, dtype: Any) -> str:
    """``auto -> sdpa for N < 768, blocked from N = 768``, the forward's and backward's apart where they differ."""
    forward, backward = (_auto_picks(module, device, dtype, grad) for grad in (False, True))
    return f"auto -> {forward}" if forward == backward else f"auto -> fwd: {forward}; bwd: {backward}"


def _wrapped(head: str, text: str, indent: str) -> list[str]:
    """``head`` and ``text`` wrapped to :data:`LIST_WIDTH` columns at ``indent``, no word split."""
    return textwrap.wrap(text, LIST_WIDTH, initial_indent=head, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [head.rstrip()]


def _tasks_lines() -> list[str]:
    """The quality tasks, a line each: model kind(s) of its presets, headline metric, its presets where not all."""
    from bench.quality.settings import list_task_presets, task_settings  # lazy: CLI start-up
    from bench.quality.tasks import list_tasks, task_info  # lazy: CLI start-up

    every = set(list_task_presets())
    rows = [("task", "model kind", "headline metric")]
    notes = [""]
    for name in list_tasks():
        info = task_info(name)
        kinds = sorted({info.model_kind(task_settings(name, p).data) for p in info.presets})
        rows.append((name, "/".join(kinds) or info.model_kind(), info.metric_title))
        missing = every - set(info.presets)
        notes.append(f"(presets: {', '.join(sorted(info.presets))})" if missing else "")
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["quality tasks (attn-bench train TASK; a grid's tasks)"]
    for row, note in zip(rows, notes):
        line = "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths))
        if len(line.rstrip()) + 2 + len(note) <= LIST_WIDTH:
            lines.append((line + "  " + note).rstrip())
        else:  # the presets on a line of their own, under the task's model kind
            lines += [line.rstrip(), " " * (4 + widths[0]) + note]
    return lines



def _attention_info(name: str) -> Any:
    """The registry entry of attention ``name``; ``UsageError`` naming ``NAME`` if unknown."""
    from attn import attention_info, list_attention  # lazy: CLI start-up

    known = list_attention()
    if name not in known:
        raise UsageError(f"NAME: unknown attention {name!r}; registered attentions are {known} "
                         "(a plug-in's attention needs --plugin MODULE)")
    return attention_info(name)


def _check_params(name: str, info: Any, items: list[str] | None) -> dict[str, Any] | None:
    """``--param KEY=VALUE`` items as variant parameters, validated by building the variant."""
    from attn import create_attention  # lazy: CLI start-up
    from bench.engine.bounded_yaml import YamlLimitError, load_bounded  # lazy: CLI start-up
    from bench.engine.messages import cut, shown  # lazy: CLI start-up

    if not items:
        return None
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param must be KEY=VALUE with KEY one of {sorted(info.params)}; "
                             f"got {item!r}")
        if key not in info.params:
            raise UsageError(f"--param {key}: unknown parameter of {name!r}; allowed keys are "
                             f"{sorted(info.params)}")
        try:
            params[key] = load_bounded(value, f"--param {key}")
        except YamlLimitError as err:
            raise UsageError(f"{err} (the value {shown(value)} must be a YAML value, e.g. 128, "
                             "0.5, alibi, null)") from None
    try:
        create_attention(name, num_heads=8, head_dim=64, **params)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--param: {cut(str(err), 1000)}") from None
    return params


#: what ``check`` says it runs, first (the profiles of attn.conformance.check_attention)
KIT_QUICK = ("quick profile: the first example parameter set, two shapes, each causal x key_mask "
             "combination on one of them, every check on every kernel (--full: every parameter "
             "set, shape and combination, as the test suite runs it)")
KIT_FULL = "full kit: every example parameter set and shape, every check on every kernel"
#: the dtypes ``check --dtype`` takes (attn.conformance.CHECK_DTYPES; no torch import here)
KIT_DTYPES = ("float64", "float32", "bfloat16", "float16")


@app.command()
@user_errors
def check(
    name: Annotated[str, typer.Argument(help="Registered or plug-in attention name.")],
    kernel: Annotated[list[str] | None, typer.Option(help="Kernels to check; repeatable (default all).")] = None,
    param: Annotated[list[str] | None, typer.Option(
        help="Variant parameter KEY=VALUE (YAML value); repeatable.")] = None,
    device: Annotated[str, typer.Option(help="Device (cpu, cuda).")] = "cpu",
    dtype: Annotated[list[str] | None, typer.Option(
        help="Dtype the checks run in (float64, float32, bfloat16, float16), each against the "
             "float64 reference with its own tolerances; repeatable (default float64 and "
             "float32).")] = None,
    plugin: PluginOpt = None,
    timeout_s: Annotated[float, typer.Option(  # attn.conformance.CHECK_TIMEOUT_S (no torch here)
        help="Time limit of each check (s); each runs in a child process, so a variant that "
             "exits, crashes or hangs fails that check with the cause.")] = 300.0,
    full: Annotated[bool, typer.Option(
        "--full", help="The whole kit: every example parameter set and every shape, as the test "
                       "suite runs it (default: the quick profile, the first parameter set and "
                       "two shapes, each causal x key_mask combination on one of them; every "
                       "check on every kernel either way).")] = False,
) -> None:
    """Run the conformance kit on a variant (the quick profile unless ``--full``); a line as
    each check starts and one as it ends; non-zero exit with the reasons when it fails."""
    from bench.engine.config import DEVICES  # lazy: CLI start-up

    if not timeout_s > 0:
        raise UsageError(f"--timeout-s: must be a number > 0 (e.g. 300); got {timeout_s:g}")
    import_plugin_options(plugin)
    choice("--device", device, DEVICES)
    check_device_option(device)
    for one in dtype or []:
        choice("--dtype", one, KIT_DTYPES)
    info = _attention_info(name)
    for k in kernel or []:
        if k not in info.kernels:
            raise UsageError(f"--kernel: {name!r} has no kernel {k!r}; allowed values are "
                             f"{list(info.kernels)}")
    params = _check_params(name, info, param)
    from attn.conformance import check_attention  # lazy: CLI start-up

    typer.echo(KIT_FULL if full else KIT_QUICK)
    started = [time.monotonic()]

    def starting(check: str, kernel: str, params: dict[str, Any]) -> None:
        started[0] = time.monotonic()  # a compiling check may run a while: say what runs
        typer.echo(f"[ .. ] {check} kernel={kernel} params={params}")

    def say(one: Any) -> None:  # a line per check as it finishes: a long kit is not silent
        typer.echo(f"{one} ({time.monotonic() - started[0]:.1f} s)")
        started[0] = time.monotonic()  # a check reported without starting (not run) took none

    result = check_attention(name, params=params, kernels=kernel, device=device, dtypes=dtype,
                             timeout_s=timeout_s, quick=not full, on_result=say,
                             on_start=starting)
    summary, *rest = str(result).splitlines()
    typer.echo("\n".join([summary, *(line for line in rest if line.startswith("note: "))]))
    if not result.passed:
        for failure in result.failures:
            typer.secho(f"FAIL: {failure}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


