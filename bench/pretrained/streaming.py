"""Streaming past the trained context with a rolling KV cache (StreamingLLM, Xiao et al. 2023).

The stream is read in chunks of ``chunk`` tokens. The cache keeps the first ``sinks`` tokens
and the ``recent`` tokens before the chunk; in the chunk, query ``i`` sees the sinks and the
``recent`` tokens before it (``global_tokens(num_global=sinks, window=recent)``, bottom-right
aligned against the cache; ``sliding_window`` without sinks), which is what a token-by-token
stream with that cache sees, computed a chunk at a time. A policy without eviction is full
attention, run as far as ``max_tokens``.

Positions are either ``original`` (the token's place in the stream, past the trained context
after 8K) or ``cache`` (its place in the cache, re-indexed as StreamingLLM does: the kept
keys are rotated back by the number of tokens evicted, so every distance stays within the
cache). With ``cache`` positions, query ``i`` of a chunk sits at the cache length plus ``i``,
so its distance to a sink is up to ``chunk`` larger than one token at a time would give.
"""

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
    """What the cache keeps: ``sinks`` first tokens and ``recent`` latest ones (``recent``
    ``None``: everything, full attention, up to ``max_tokens``)."""

    label: str
    sinks: int = 0
    recent: int | None = None
    max_tokens: int | None = None

    @property
    def evicts(self) -> bool:
        return self.recent is not None

    def attention(self) -> tuple[str, dict[str, int]]:
        """The variant a chunk's queries attend with."""
        if not self.evicts:
            return "causal", {}
        if self.sinks:
            return "global_tokens", {"num_global": self.sinks, "window": self.recent}
        return "sliding_window", {"window": self.recent}

    def cache_tokens(self, seen: int) -> int:
        """Tokens the cache holds after ``seen`` tokens of the stream."""
        return seen if not self.evicts else min(seen, self.sinks + self.recent)


def _rotate_back(model: nn.Module, keys: torch.Tensor, shift: int) -> torch.Tensor:
    """``keys`` ``(B, H, L, D)`` rotated by the rotary angle of ``-shift`` positions."""
    rotary = model.get_decoder().rotary_emb
    cos, sin = rotary(keys, torch.tensor([[shift]], device=keys.device))  # (1, 1, D)
    half = keys.shape[-1] // 2
    rotated = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
    return keys * cos[:, None].to(keys.dtype) - rotated * sin[:, None].to(keys.dtype)


def _evict(model: nn.Module, cache: object, policy: CachePolicy, reindex: bool) -> None:
    """Keep the sinks and the ``recent`` latest tokens of every layer's cache; with cache
    positions, rotate the kept recent keys back by the number of tokens dropped."""
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
    """Per-token negative log-likelihoods ``(N - 1,)`` of the stream ``ids`` ``(1, N)`` under
    ``policy`` (targets 1..N-1; full attention stops at ``max_tokens``), and the seconds
    taken."""
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
