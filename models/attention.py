"""Multi-head attention over any registered attention, with an optional KV cache."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import attn


class KVCache:
    """Keys and values of past positions for one attention layer, ``(B, H, T, D)``.

    ``keep_first`` / ``keep_last`` bound what is stored: after each update only the first
    ``keep_first`` and the last ``keep_last`` keys are kept (all keys when ``keep_last`` is
    None). Because attention positions are bottom-right aligned and the banded patterns
    depend only on ``i - j`` (plus ``j < num_global``), the trimmed cache gives exactly the
    same result as the full one (see :func:`cache_policy`). A ``static`` cache (cross
    attention) is filled once from the encoder memory and never grows.
    """

    def __init__(self, keep_first: int = 0, keep_last: int | None = None, static: bool = False):
        self.keep_first = keep_first
        self.keep_last = keep_last
        self.static = static
        self.k: Tensor | None = None  # (B, H, T, D): a view of the buffer when unbounded
        self.v: Tensor | None = None
        self._k_buf: Tensor | None = None  # (B, H, capacity, D), grown by doubling
        self._v_buf: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of keys stored now."""
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append new ``k, v (B, H, Nnew, D)``; return every key the new queries may need."""
        if self.static:
            self.k, self.v = k, v  # cross attention: set once from the memory
            return k, v
        if self.keep_last is None:
            self._append(k, v)  # amortised O(Nnew): no copy of the past per step
            return self.k, self.v
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)  # (B, H, T + Nnew, D), T bounded by the band
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = self._trim(k), self._trim(v)
        return k, v

    def _append(self, k: Tensor, v: Tensor) -> None:
        old, new = self.length, k.shape[2]
        if self._k_buf is None or old + new > self._k_buf.shape[2]:
            capacity = max(2 * (old + new), 16)
            k_buf = k.new_empty(*k.shape[:2], capacity, k.shape[3])
            v_buf = v.new_empty(*v.shape[:2], capacity, v.shape[3])
            if old:
                k_buf[:, :, :old] = self.k
                v_buf[:, :, :old] = self.v
            self._k_buf, self._v_buf = k_buf, v_buf
        self._k_buf[:, :, old : old + new] = k
        self._v_buf[:, :, old : old + new] = v
        self.k = self._k_buf[:, :, : old + new]
        self.v = self._v_buf[:, :, : old + new]

    def _trim(self, x: Tensor) -> Tensor:
        if self.keep_last is None or x.shape[2] <= self.keep_first + self.keep_last:
            return x
        tail = x[:, :, -self.keep_last :]
        if self.keep_first == 0:
            return tail
        return torch.cat([x[:, :, : self.keep_first], tail], dim=2)

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search)."""
        if self.k is None:
            return
        if self._k_buf is not None:
            self._k_buf = self._k_buf.index_select(0, index)
            self._v_buf = self._v_buf.index_select(0, index)
            self.k = self._k_buf[:, :, : self.length]
            self.v = self._v_buf[:, :, : self.length]
        else:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def cache_policy(attention: attn.Attention) -> tuple[int, int | None]:
    """``(keep_first, keep_last)`` that keeps cached decoding exact for ``attention``.

    A banded pattern (``band()``: window w, dilation r, g global positions) lets a causal
    query see at most the last ``r*w + 1`` keys plus the first g: keep those. The kept keys
    are contiguous at the end, so ``j - i`` (and a relative bias on it) is unchanged; with
    g > 0 the concatenation [globals, recent] changes ``j - i`` for the globals, so a
    variant with a score_mod (relative bias) and globals keeps everything.
    """
    band = attention.band()
    if band is None:
        return 0, None
    if band.num_global > 0 and attention.score_mod() is not None:
        return 0, None
    return band.num_global, band.dilation * band.window + 1


class MultiHeadAttention(nn.Module):
    """Q/K/V/output projections around any registered attention (self or cross).

    ``x (B, Nq, D)`` attends over ``context (B, Nk, D)`` (``x`` itself when None).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        attention: str = "full",
        attention_params: dict[str, Any] | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model: must be divisible by num_heads={num_heads}; got {d_model}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attention = attn.create_attention(
            attention,
            num_heads=num_heads,
            head_dim=self.head_dim,
            kernel=kernel,
            **(attention_params or {}),
        )

    def new_cache(self, static: bool = False) -> KVCache:
        """An empty cache sized by this layer's attention pattern (all keys for static)."""
        if static:
            return KVCache(static=True)
        keep_first, keep_last = cache_policy(self.attention)
        return KVCache(keep_first, keep_last)

    def split(self, x: Tensor) -> Tensor:
        """``(B, N, D)`` -> per-head ``(B, H, N, Dh)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, N, Dh)

    def queries(self, x: Tensor) -> Tensor:
        """Per-head queries ``(B, H, Nq, Dh)`` of ``x (B, Nq, D)``."""
        return self.split(self.q_proj(x))

    def keys_values(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head keys and values ``(B, H, Nk, Dh)`` of ``context (B, Nk, D)``."""
        return self.split(self.k_proj(context)), self.split(self.v_proj(context))

    def project(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head ``q (B, H, Nq, Dh)``, ``k, v (B, H, Nk, Dh)`` (each token independently)."""
        return (self.queries(x), *self.keys_values(x if context is None else context))

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
    ) -> Tensor:
        """Attention over per-head tensors, merged and projected: -> ``(B, Nq, D)``."""
        out = self.attention(q, k, v, causal=causal, key_mask=key_mask)  # (B, H, Nq, Dh)
        batch, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))  # (B, Nq, D)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        causal: bool = False,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``x (B, Nq, D)`` attends over ``context`` (default ``x``), through ``cache`` if given."""
        q = self.queries(x)  # (B, H, Nq, Dh)
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # cross attention: memory projected once
        else:
            k, v = self.keys_values(x if context is None else context)  # (B, H, Nk, Dh)
            if cache is not None:
                if key_mask is not None and not cache.static:
                    raise ValueError("key_mask: not supported together with a growing KV cache")
                k, v = cache.update(k, v)
        return self.attend(q, k, v, causal=causal, key_mask=key_mask)
