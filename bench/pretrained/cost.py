"""What a pattern costs inside the pretrained model: prefill time and peak memory (patterns timed in
interleaved rounds), and a decoding step's time against the KV cache it needs (docs/pretrained.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bench.engine.measure import tensor_peak_bytes_cpu
from bench.pretrained.scoring import hidden_states
from models.pretrained import attention_layers, place_attention


def kv_tokens(variant: str, params: dict[str, Any], context: int) -> int | None:
    """Tokens of KV cache a pattern needs at ``context`` tokens (``None``: no known rule)."""
    if variant in ("full", "causal"):
        return context
    if variant == "sliding_window":
        return min(context, params["window"])
    if variant == "dilated":
        dilation = params.get("dilation", 1)
        widest = max(dilation) if isinstance(dilation, (list, tuple)) else dilation
        return min(context, params["window"] * widest)
    if variant == "global_tokens":
        return min(context, params["num_global"] + params["window"])
    return None


def kv_cache_bytes(model: nn.Module, tokens: int) -> int:
    layers = attention_layers(model)
    config = layers[0].config
    size = next(model.parameters()).element_size()
    return 2 * len(layers) * config.num_key_value_heads * layers[0].head_dim * tokens * size


def prefill(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """A generation's prefill: the prompt's forward and the first token's logits."""
    hidden = hidden_states(model, ids)
    return model.get_output_embeddings()(hidden[:, -1:])


Pattern = tuple[str, dict[str, Any], tuple[int, ...] | None]


@torch.no_grad()
def timed_prefill(model: nn.Module, ids: torch.Tensor, patterns: Sequence[Pattern], repeats: int,
                  kernel: str = "auto") -> list[dict[str, Any]]:
    """Per pattern: peak tensor memory (one call, also the warm-up), then prefill times over interleaved rounds."""
    peaks = []
    for variant, params, layers in patterns:
        place_attention(model, variant, params, layers=layers, kernel=kernel)
        started = time.perf_counter()
        prefill(model, ids)
        peaks.append(tensor_peak_bytes_cpu(lambda: prefill(model, ids),
                                           time.perf_counter() - started))
    times: list[list[float]] = [[] for _ in patterns]
    for _ in range(repeats):
        for i, (variant, params, layers) in enumerate(patterns):
            place_attention(model, variant, params, layers=layers, kernel=kernel)
            started = time.perf_counter()
            prefill(model, ids)
            times[i].append((time.perf_counter() - started) * 1e3)
    return [{"time_ms": statistics.median(t), "time_iqr_ms": _iqr(t), "times_ms": t,
             "repeats": len(t), "peak_mem_bytes": peak} for t, peak in zip(times, peaks)]


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


@torch.no_grad()
def timed_decode_step(model: nn.Module, context: int, kept: int, steps: int,
                      seed: int = 0) -> list[float]:
    """Milliseconds of ``steps`` one-token steps at position ``context`` against ``kept`` random cached tokens."""
    from transformers import DynamicCache  # the pretrained extra, loaded in the worker only

    layers = attention_layers(model)
    config = layers[0].config
    generator = torch.Generator().manual_seed(seed)
    shape = (1, config.num_key_value_heads, kept, layers[0].head_dim)
    dtype = next(model.parameters()).dtype
    cache = DynamicCache()
    for layer in layers:
        keys = torch.randn(shape, generator=generator, dtype=dtype)
        cache.update(keys, torch.randn(shape, generator=generator, dtype=dtype), layer.layer_idx)
    token = torch.tensor([[config.bos_token_id or 0]])
    times = []
    for _ in range(steps + 1):  # the first is a warm-up
        started = time.perf_counter()
        model(input_ids=token, cache=cache, position_ids=torch.tensor([[context]]),
              use_cache=True, logits_to_keep=1)
        times.append((time.perf_counter() - started) * 1e3)
        for layer in cache.layers:  # back to the context measured
            layer.keys, layer.values = layer.keys[..., :kept, :], layer.values[..., :kept, :]
    return times[1:]
