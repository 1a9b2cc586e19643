"""Time per generated token against the context length (``attn-bench decoding-step``): single-token steps after
a prompt of each context, contexts interleaved, and the per-repeat ratio to the shortest context's."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bench.engine.fsutil import atomic_write_text
from bench.engine.markdown import markdown_table
from bench.engine.provenance import environment
from bench.engine.results import write_env
from bench.engine.threads import torch_threads
from models import create_model


@dataclass(frozen=True)
class StepOptions:
    attention: tuple[str, ...] = ("full",)
    context: tuple[int, ...] = (1024, 4096, 16384, 32768)
    steps: int = 16  # tokens timed per context per repeat
    repeats: int = 7
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 1024
    vocab_size: int = 256
    threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "repeats", "d_model", "num_heads", "num_layers", "d_ff", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be an integer >= 1; got {value!r}")
        if not self.context or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.context):
            raise ValueError(f"--context: must be integers >= 1; got {list(self.context)}")
        if not self.attention:
            raise ValueError("--attention: must not be empty")
        if self.d_model % self.num_heads:
            raise ValueError(f"--d-model: must be divisible by --num-heads={self.num_heads}; got {self.d_model}")


def _model(options: StepOptions, attention: str) -> torch.nn.Module:
    torch.manual_seed(options.seed)
    return create_model(
        "decoder_lm", attention=attention, d_model=options.d_model, num_heads=options.num_heads,
        num_layers=options.num_layers, d_ff=options.d_ff, vocab_size=options.vocab_size,
        max_len=max(options.context) + options.steps * (options.repeats + 1) + 1,
    ).eval()


def step_times(options: StepOptions, attention: str) -> dict[int, list[float]]:
    """Seconds per token at each context, one value per repeat."""
    model = _model(options, attention)
    gen = torch.Generator().manual_seed(options.seed)
    caches, tokens = {}, {}
    for ctx in options.context:  # prefill each context through the cache
        prompt = torch.randint(0, options.vocab_size, (1, ctx), generator=gen)
        caches[ctx] = model.new_cache()
        tokens[ctx] = model(prompt, cache=caches[ctx])[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    for ctx in options.context:  # warm-up step
        tokens[ctx] = model(tokens[ctx], cache=caches[ctx])[:, -1].argmax(-1, keepdim=True)
    times: dict[int, list[float]] = {ctx: [] for ctx in options.context}
    for _ in range(options.repeats):
        for ctx in options.context:
            start = time.perf_counter()
            for _ in range(options.steps):
                tokens[ctx] = model(tokens[ctx], cache=caches[ctx])[:, -1].argmax(-1, keepdim=True)
            times[ctx].append((time.perf_counter() - start) / options.steps)
    return times


def step_rows(options: StepOptions, attention: str, times: dict[int, list[float]]) -> list[dict[str, Any]]:
    first = times[options.context[0]]
    rows = []
    for ctx, per_repeat in times.items():
        ratios = [t / f for t, f in zip(per_repeat, first)]  # per repeat: same moment of the run
        rows.append({
            "attention": attention, "context": ctx, "steps": options.steps, "repeats": options.repeats,
            "ms_per_token": 1e3 * statistics.median(per_repeat), "ms_min": 1e3 * min(per_repeat),
            "ms_max": 1e3 * max(per_repeat), "ratio_to_shortest": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "times_ms": " ".join(f"{1e3 * t:.3f}" for t in per_repeat),
        })
    return rows


def summary_markdown(df: pd.DataFrame, options: StepOptions, env: dict[str, Any]) -> str:
    lines = [
        "# Time per generated token against the context length", "",
        f"decoder_lm d_model={options.d_model} heads={options.num_heads} layers={options.num_layers} "
        f"d_ff={options.d_ff}, batch 1, greedy single-token steps through the cache after a prompt "
        f"of `context` tokens; {options.steps} tokens per context per repeat, {options.repeats} repeats, "
        "contexts interleaved in every repeat. ms: median [min, max] over repeats; ratio: the "
        "per-repeat time over the shortest context's in the same repeat, median [min, max].", "",
    ]
    shown = df.assign(
        ms_per_token=[f"{m:.3f} [{a:.3f}, {b:.3f}]" for m, a, b in zip(df.ms_per_token, df.ms_min, df.ms_max)],
        ratio=[f"{m:.2f} [{a:.2f}, {b:.2f}]" for m, a, b in zip(df.ratio_to_shortest, df.ratio_min, df.ratio_max)],
    )[["attention", "context", "ms_per_token", "ratio"]]
    lines += [markdown_table(shown), "", "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def run_decoding_step(options: StepOptions, out: Path) -> pd.DataFrame:
    """Write ``steps.csv`` (not a sweep's ``results.csv``: no report page reads it), ``summary.md``, ``env.json``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; give a directory (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with torch_threads(options.threads), torch.inference_mode():
        for attention in options.attention:
            print(f"decoding steps: {attention} at contexts {list(options.context)} ...", flush=True)
            rows += step_rows(options, attention, step_times(options, attention))
    env = environment("cpu", options.threads)
    df = pd.DataFrame(rows)
    df.assign(git_sha=env["git_sha"], torch_version=env["torch_version"]).to_csv(out / "steps.csv", index=False)
    write_env(out, [env])
    summary = summary_markdown(df, options, env)
    atomic_write_text(out / "summary.md", summary)
    print(summary)
    return df
