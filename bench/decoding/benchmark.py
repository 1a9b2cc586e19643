"""``attn-bench decoding``: ``decoder_lm.generate`` tokens/s with and without the KV cache (per context and
``--num-kv-heads``, with the cache's bytes), and the streaming encoder's step time against recomputing the window
(interleaved rounds); into ``results.csv`` (column ``benchmark``), ``summary.md`` and ``env.json``."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import attn
from attn.devices import synchronize
from bench.decoding.options import DecodingOptions
from bench.engine.fsutil import atomic_write_text
from bench.engine.provenance import environment
from bench.engine.results import write_env
from bench.engine.threads import torch_threads
from models import create_model
from models.registry import model_config

SPEEDUP_GOAL = 5.0  # the cache must be at least this much faster at the longest context


def _median_time(fn: Callable[[], Any], repeats: int, device: torch.device | None = None) -> float:
    device = torch.device("cpu") if device is None else device
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _attention_spec(spec: str, window: int) -> tuple[str, dict[str, Any]]:
    """``--attention`` value -> (name, params); banded variants get ``--window``."""
    params: dict[str, Any] = {}
    if spec in ("sliding_window", "dilated"):
        params["window"] = window
    elif spec == "global_tokens":
        params.update(num_global=1, window=window)
    return spec, params


def bench_decoding(
    attention: str,
    params: dict[str, Any],
    context: int,
    new_tokens: int,
    sizes: dict[str, int],
    repeats: int,
    seed: int = 0,
    device: str | torch.device = "cpu",
    num_kv_heads: int | None = None,
) -> list[dict[str, Any]]:
    """Rows for cached and uncached greedy decoding of ``new_tokens`` after ``context`` tokens on ``device``."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = create_model(
        "decoder_lm", size="lra_base", attention=attention, attention_params=params,
        max_len=context + new_tokens, num_kv_heads=num_kv_heads, **sizes,
    ).eval().to(device)
    prompt = torch.randint(0, model.config.vocab_size, (1, context)).to(device)
    model.generate(prompt[:, :16], 2)  # warm-up (kernel selection, allocator)
    held = cache_bytes(model, prompt, new_tokens)
    rows = []
    for use_cache in (True, False):
        total = _median_time(lambda c=use_cache: model.generate(prompt, new_tokens, use_cache=c),
                             repeats, device)
        first = _median_time(lambda c=use_cache: model.generate(prompt, 1, use_cache=c), repeats, device)
        decode_s = max(total - first, 1e-9)
        rows.append({
            "benchmark": "decoding", "model": "decoder_lm", "attention": attention,
            "params": str(params), "context": context, "new_tokens": new_tokens,
            "use_cache": use_cache, "time_s": total, "time_to_first_token_s": first,
            "tokens_per_s": new_tokens / total,
            "decode_tokens_per_s": (new_tokens - 1) / decode_s if new_tokens > 1 else float("nan"),
            "repeats": repeats, "device": device.type, **sizes,
            "num_kv_heads": model.config.num_kv_heads, "cache_bytes": held if use_cache else 0,
        })
    return rows


def cache_bytes(model: Any, prompt: Tensor, new_tokens: int) -> int:
    """Bytes ``model``'s KV cache holds after ``prompt (1, N)`` and ``new_tokens`` (the last one never cached)."""
    cache = model.new_cache()
    logits = model(prompt, cache=cache)  # (1, N, V)
    for _ in range(new_tokens - 1):
        logits = model(logits[:, -1:].argmax(-1), cache=cache)  # (1, 1, V)
    return sum(getattr(layer, "nbytes", 0) for layer in cache.layers)


def bench_streaming(
    window: int, num_layers: int, steps: int, sizes: dict[str, int], repeats: int, seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """Per-step time of the streaming encoder against recomputing the window, in ``repeats`` interleaved
    rounds: one row per first-block path, with the median per-round ratio and its quartiles."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = create_model(
        "encoder_classifier", size="lra_base", position="none", max_len=window,
        **{**sizes, "num_layers": num_layers},
    ).eval().to(device)
    ids = torch.randint(0, model.config.vocab_size, (1, window + steps * (repeats + 1))).to(device)
    updates = ("auto",) if num_layers == 1 else ("auto", "recompute")
    streams = {u: model.stream(window, update=u) for u in updates}
    for stream in streams.values():
        stream.prefill(ids[:, :window])
    cursor = {"t": window}  # each round streams new tokens (the same ones to every stream)

    def run_stream(stream: Any) -> Callable[[], None]:
        def run() -> None:
            for t in range(cursor["t"], cursor["t"] + steps):
                stream.step(ids[:, t])
        return run

    def run_recompute() -> None:
        for t in range(cursor["t"], cursor["t"] + steps):
            streams["auto"].batch_forward(ids[:, t + 1 - window : t + 1])

    timed = {**{u: run_stream(s) for u, s in streams.items()}, "window": run_recompute}
    times: dict[str, list[float]] = {name: [] for name in timed}
    for round_ in range(repeats + 1):  # round 0 warms up and is not kept
        for name, fn in timed.items():
            seconds = _median_time(fn, 1, device) / steps
            if round_:
                times[name].append(seconds)
        cursor["t"] += steps
    rows = []
    for update, stream in streams.items():
        ratios = [r / s for r, s in zip(times["window"], times[update], strict=True)]
        q25, q50, q75 = (float(q) for q in np.percentile(np.asarray(ratios, dtype=float), [25, 50, 75]))
        path = stream.last_path
        rows.append({
            "benchmark": "streaming", "model": "encoder_classifier", "attention": "full",
            "window": window, "num_layers": num_layers, "steps": steps,
            "path": path.first_layer, "fallback": path.fallback or "",
            "step_ms": 1e3 * statistics.median(times[update]),
            "recompute_ms": 1e3 * statistics.median(times["window"]),
            "speedup": q50, "speedup_q25": q25, "speedup_q75": q75,
            "step_times_ms": json.dumps([round(1e3 * t, 4) for t in times[update]]),
            "recompute_times_ms": json.dumps([round(1e3 * t, 4) for t in times["window"]]),
            "repeats": repeats, "device": device.type,
            **{k: v for k, v in sizes.items() if k != "num_layers"},
        })
    return rows


def summary_markdown(decoding: pd.DataFrame, streaming: pd.DataFrame, env: dict[str, Any]) -> str:
    lines = ["# Decoding and streaming benchmarks", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    if not decoding.empty:
        lines += ["", "## Decoding (greedy, batch 1, decoder_lm)", ""]
        lines += [
            "tok/s counts the whole generate call (prompt prefill included); decode tok/s "
            "leaves out the time to the first token.",
            "",
            "H_kv: the decoder's key/value heads (grouped-query attention when fewer than its "
            "query heads); cache MiB: what the KV cache holds after the prompt and the new tokens, "
            "measured on the cache.",
            "",
            "| attention | H_kv | context | new tokens | cache MiB | tok/s cached | tok/s uncached | speedup "
            "| decode tok/s cached | decode tok/s uncached |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        longest = decoding["context"].max()
        for (attention, kv, context), group in decoding.groupby(["attention", "num_kv_heads", "context"],
                                                                 sort=True):
            on = group.use_cache.astype(bool)
            cached = group[on]["tokens_per_s"].iloc[0]
            uncached = group[~on]["tokens_per_s"].iloc[0]
            decode_cached = group[on]["decode_tokens_per_s"].iloc[0]
            decode_uncached = group[~on]["decode_tokens_per_s"].iloc[0]
            speedup = cached / uncached
            goal = ""
            if context == longest:
                goal = " (goal >= 5x: " + ("met" if speedup >= SPEEDUP_GOAL else "NOT met") + ")"
            held = group[on]["cache_bytes"].iloc[0] / 2**20
            lines.append(
                f"| {attention} | {kv} | {context} | {group.new_tokens.iloc[0]} | {held:.2f} | {cached:.1f} | "
                f"{uncached:.2f} | {speedup:.1f}x{goal} | {decode_cached:.1f} | "
                f"{decode_uncached:.2f} |"
            )
    if not streaming.empty:
        lines += ["", "## Streaming encoder step vs recomputing the window", ""]
        rounds = int(streaming.repeats.iloc[0])
        lines += [
            f"Each row's stream and the recomputation were timed in {rounds} interleaved rounds "
            f"(after a warm-up round) of {int(streaming.steps.iloc[0])} steps each; times are "
            "medians per step, the speedup is the median of the per-round ratios with their "
            "quartiles in brackets. The path is what the stream's first block ran "
            "(`models/streaming.py`): `retroactive-update` the O(n d) update of the softmax "
            "sums, `retroactive-recompute` all n outputs recomputed (the baseline, forced "
            "here), `single-output` one layer.",
            "",
            "| window | layers | first-block path | step ms | recompute ms | speedup [q25, q75] |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for row in streaming.itertuples():
            lines.append(
                f"| {row.window} | {row.num_layers} | {row.path} | {row.step_ms:.2f} | "
                f"{row.recompute_ms:.2f} | {row.speedup:.1f}x [{row.speedup_q25:.1f}, "
                f"{row.speedup_q75:.1f}] |"
            )
    return "\n".join(lines) + "\n"


def check_decoder_attention(spec: str, window: int, max_len: int, sizes: dict[str, int],
                            num_kv_heads: int | None = None) -> None:
    """``ValueError`` unless ``--attention spec`` can run in ``decoder_lm`` with ``num_kv_heads``."""
    known = attn.list_attention()
    causal = [n for n in known if attn.attention_info(n).supports_causal]
    if spec not in known:
        raise ValueError(f"--attention: unknown attention {spec!r}; allowed values are {causal}")
    if spec not in causal:
        raise ValueError(f"--attention: {spec!r} has no causal form, so a decoder cannot use it; "
                         f"allowed values are {causal}")
    name, params = _attention_spec(spec, window)
    try:
        model_config("decoder_lm", "lra_base", name, params, max_len=max_len, num_kv_heads=num_kv_heads,
                     **sizes)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--attention {spec}: {err}") from None


def check_attentions(options: DecodingOptions) -> None:
    """``ValueError`` naming ``--attention`` for any attention a decoder cannot run."""
    for spec in options.attention:
        for kv in options.kv_heads:
            check_decoder_attention(spec, options.window, options.max_len, options.sizes, kv)


def run_decoding_benchmark(options: DecodingOptions, out: Path) -> None:
    """Measure decoding tokens/s with and without the KV cache, and streaming step time."""
    check_attentions(options)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; give a directory (it is created if missing)")
    sizes = options.sizes
    out.mkdir(parents=True, exist_ok=True)
    decoding_rows: list[dict[str, Any]] = []
    streaming_rows: list[dict[str, Any]] = []
    with torch_threads(options.threads), torch.inference_mode():
        for spec in options.attention if "decoding" in options.benchmark else ():
            name, params = _attention_spec(spec, options.window)
            for kv in options.kv_heads:
                for ctx in options.context:
                    print(f"decoding {name} num_kv_heads={kv} context={ctx} ...", flush=True)
                    decoding_rows += bench_decoding(name, params, ctx, options.new_tokens, sizes,
                                                    options.repeats, device=options.device, num_kv_heads=kv)
        for n in options.stream_window if "streaming" in options.benchmark else ():
            for layers in options.stream_layers:
                print(f"streaming window={n} layers={layers} ...", flush=True)
                streaming_rows += bench_streaming(n, layers, options.stream_steps, sizes, options.repeats,
                                                  device=options.device)
    env = environment(options.device, options.threads)
    decoding, streaming = pd.DataFrame(decoding_rows), pd.DataFrame(streaming_rows)
    table = pd.concat([decoding, streaming], ignore_index=True).convert_dtypes()
    table = table.assign(git_sha=env["git_sha"], torch_version=env["torch_version"],
                         threads=env["threads"], timestamp=env["timestamp"])
    table.to_csv(out / "results.csv", index=False)
    write_env(out, [env])
    summary = summary_markdown(decoding, streaming, env)
    atomic_write_text(out / "summary.md", summary)
    print(summary)
