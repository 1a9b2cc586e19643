"""``attn-bench train``: one (task, variant, seed) training run, resumable after a kill."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from bench.cli.app import app
from bench.cli.common import (
    PluginOpt,
    UsageError,
    check_device_option,
    check_writable,
    choice,
    import_plugin_options,
    make_console,
    user_errors,
)


def _values(option: str, items: list[str] | None, sections: tuple[str, ...] | None
            ) -> dict[str, Any]:
    """``KEY=VALUE`` (``SECTION.KEY=VALUE`` with ``sections``) items, their YAML values read within the limits."""
    from bench.engine.bounded_yaml import YamlLimitError, load_bounded  # lazy: CLI start-up
    from bench.engine.messages import shown  # lazy: CLI start-up

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} must be KEY=VALUE; got {item!r}")
        try:
            value = load_bounded(text, f"{option} {shown(key)}")
        except YamlLimitError as err:
            raise UsageError(f"{err} (the value {shown(text)} must be a YAML value)") from None
        if sections is None:
            out[key] = value
            continue
        section, dot, name = key.partition(".")
        if not dot or section not in sections:
            raise UsageError(f"{option} {key}: must be SECTION.KEY=VALUE with SECTION one of "
                             f"{list(sections)}; got {item!r}")
        out.setdefault(section, {})[name] = value
    return out


class TaskHelpCommand(typer.core.TyperCommand):
    """The ``train`` command, whose ``TASK`` help lists the registered tasks (imported only then: they load torch)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from bench.quality.tasks import list_tasks  # lazy: CLI start-up

        for param in self.params:
            if param.name == "task":
                param.help = (f"Task: {', '.join(list_tasks())} (a --plugin module may register "
                              "more).")
        super().format_help(ctx, formatter)


@app.command(cls=TaskHelpCommand)
@user_errors
def train(
    task: Annotated[str, typer.Argument(help="Task: a registered task (the list is in "
                                             "`attn-bench train --help` and `attn-bench list`).")],
    variant: Annotated[str, typer.Option(help="Attention variant (registered name).")] = "full",
    param: Annotated[list[str] | None, typer.Option(
        help="Variant parameter KEY=VALUE (YAML value); repeatable. The preset's attention "
             "settings (e.g. window) apply to every parameter not given.")] = None,
    preset: Annotated[str, typer.Option(help="Task preset: small (CPU), lra (GPU), tiny (smoke).")]
    = "small",
    seed: Annotated[int, typer.Option(min=0, help="Training seed (initialisation, batch order).")] = 0,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Run directory (default runs/train/<task>-<variant>-seed<S>).")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a preset setting SECTION.KEY=VALUE (sections: data, model, "
                      "attention, train), e.g. train.steps=100; repeatable.")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda (bf16 autocast on cuda).")] = "cpu",
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads.")] = None,
    kernel: Annotated[str, typer.Option(help="Kernel of the attention (auto or a name).")] = "auto",
    plugin: PluginOpt = None,
) -> None:
    """Train a variant on a task, keep the best-validation checkpoint, evaluate it on test.

    Resumable: rerunning the same command after a kill continues from the last checkpoint.
    """
    from attn import attention_info, list_attention  # lazy: CLI start-up
    from bench.engine.config import DEVICES, safe_name  # lazy: CLI start-up
    from bench.quality.settings import list_task_presets  # lazy: CLI start-up
    from bench.quality.tasks import list_tasks  # lazy: CLI start-up
    from bench.quality.train import RunSpec, train_run  # lazy: CLI start-up

    import_plugin_options(plugin)
    choice("TASK", task, tuple(list_tasks()))
    choice("--variant", variant, tuple(list_attention()))
    choice("--preset", preset, tuple(list_task_presets()))
    choice("--device", device, DEVICES)
    check_device_option(device)
    info = attention_info(variant)
    choice("--kernel", kernel, ("auto", *info.kernels))
    params = _values("--param", param, None)
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise UsageError(f"--param {unknown[0]}: unknown parameter of {variant!r}; allowed keys "
                         f"are {sorted(info.params)}")
    overrides = _values("--set", set_, ("data", "model", "attention", "train"))
    run_dir = out or Path("runs") / "train" / safe_name(f"{task}-{variant}-seed{seed}")
    check_writable(run_dir)
    spec = RunSpec(task=task, variant=variant, preset=preset, seed=seed, out=str(run_dir),
                   params=params, device=device, threads=threads, kernel=kernel,
                   overrides=overrides)
    _print_rows(_train_with_progress(spec, train_run), run_dir)


def _train_with_progress(spec: Any, train_run: Any) -> list[dict[str, Any]]:
    """``train_run`` under a progress bar with the loss and the training throughput."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bench.quality.settings import task_settings  # lazy: CLI start-up

    steps = task_settings(spec.task, spec.preset, spec.overrides).train.steps
    progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]:.4f}"),
                        TextColumn("{task.fields[rate]:.0f} tok/s"), TimeElapsedColumn(),
                        console=make_console())  # a log line is not wrapped in a pipe
    bar = progress.add_task("train", total=steps, loss=float("nan"), rate=0.0)
    with progress:
        def on_step(step: int, loss: float, rate: float) -> None:
            progress.update(bar, completed=step, loss=loss, rate=rate)

        return train_run(spec, log=progress.console.print, on_step=on_step)


def _print_rows(rows: list[dict[str, Any]], run_dir: Path) -> None:
    if rows and rows[0]["status"] != "ok":
        typer.echo(f"{rows[0]['status']}: {rows[0]['reason']}")
        raise typer.Exit(1)
    for row in rows:
        condition = f" [{row['condition']}]" if row["condition"] else ""
        typer.echo(f"{row['split']:5s} {row['metric']}{condition}: {row['value']:.4f}")
    first = rows[0]
    typer.echo(f"best step {first['best_step']} of {first['steps']}, {first['param_count']} "
               f"parameters, {first['train_tokens_per_s']:.0f} training tokens/s; "
               f"rows in {run_dir / 'metrics.json'}")
