"""Streaming past the trained context with a rolling KV cache (StreamingLLM, Xiao et al. 2023), a chunk
at a time; policies and ``original`` / ``cache`` positions: docs/pretrained.md."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from bench.pretrained.scoring import next_token_nll
from models.pretrained import place_attention

POSITIONS = ("original", "cache")


@dataclass(frozen=True)
class CachePolicy:
    """What the cache keeps: ``sinks`` first and ``recent`` latest tokens (``recent`` None: all, to ``max_tokens``)."""

    label: str
    sinks: int = 0
    recent: int | None = None
    max_tokens: int | None = None

    @property
    def evicts(self) -> bool:
        return self.recent is not None

    def attention(self) -> tuple[str, dict[str, int]]:
        if not self.evicts:
            return "causal", {}
        if self.sinks:
            return "global_tokens", {"num_global": self.sinks, "window": self.recent}
        return "sliding_window", {"window": self.recent}

    def cache_tokens(self, seen: int) -> int:
        return seen if not self.evicts else min(seen, self.sinks + self.recent)


def _rotate_back(model: nn.Module, keys: torch.Tensor, shift: int) -> torch.Tensor:
    """``keys`` ``(B, H, L, D)`` rotated by the rotary angle of ``-shift`` positions."""
    rotary = model.get_decoder().rotary_emb
    cos, sin = rotary(keys, torch.tensor([[shift]], device=keys.device))  # (1, 1, D)
    half = keys.shape[-1] // 2
    rotated = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
    return keys * cos[:, None].to(keys.dtype) - rotated * sin[:, None].to(keys.dtype)


def _evict(model: nn.Module, cache: object, policy: CachePolicy, reindex: bool) -> None:
    """Keep the sinks and ``recent`` latest tokens of each layer; ``reindex``: rotate kept keys back by the drop."""
    for layer in cache.layers:  # transformers' DynamicCache
        length = layer.keys.shape[-2]
        drop = length - policy.sinks - policy.recent
        if drop <= 0:
            continue
        keys = layer.keys[..., policy.sinks + drop:, :]
        if reindex:
            keys = _rotate_back(model, keys, drop)
        layer.keys = torch.cat([layer.keys[..., :policy.sinks, :], keys], dim=-2)
        layer.values = torch.cat([layer.values[..., :policy.sinks, :],
                                  layer.values[..., policy.sinks + drop:, :]], dim=-2)


@torch.no_grad()
def stream_nll(model: nn.Module, ids: torch.Tensor, policy: CachePolicy, positions: str,
               chunk: int, kernel: str = "auto") -> tuple[torch.Tensor, float]:
    """Per-token NLLs ``(N - 1,)`` of the stream ``ids (1, N)`` under ``policy``, and the seconds taken."""
    from transformers import DynamicCache  # the pretrained extra; models.pretrained checked it

    if positions not in POSITIONS:
        raise ValueError(f"positions: must be one of {list(POSITIONS)}; got {positions!r}")
    variant, params = policy.attention()
    place_attention(model, variant, params, kernel=kernel)
    total = ids.shape[1] if policy.max_tokens is None else min(ids.shape[1], policy.max_tokens)
    cache, parts, previous = DynamicCache(), [], None
    started = time.perf_counter()
    for first in range(0, total, chunk):
        piece = ids[:, first:min(first + chunk, total)]
        held = cache.get_seq_length()
        offset = first if positions == "original" else held
        position_ids = torch.arange(offset, offset + piece.shape[1])[None]
        hidden = model.get_decoder()(input_ids=piece, cache=cache,
                                     position_ids=position_ids, use_cache=True).last_hidden_state
        if previous is not None:  # the first token of this chunk, predicted by the last one
            joined = torch.cat([previous, hidden], dim=1)
            parts.append(next_token_nll(model, joined, torch.cat([ids[:, first - 1:first], piece], 1), 1))
        else:
            parts.append(next_token_nll(model, hidden, piece, 1))
        previous = hidden[:, -1:]
        if policy.evicts:
            _evict(model, cache, policy, reindex=positions == "cache")
    return torch.cat(parts, dim=1)[0], time.perf_counter() - started
