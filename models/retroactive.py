"""Retroactive softmax attention over a sliding window, updated in O(n * d) per step, exact for plain softmax only
(:func:`retroactive_reason`; docs/models.md, "Streaming")."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import attn

#: a row whose denominator falls below this fraction of its peak is recomputed exactly (float64 keeps
#: ~16 digits; this spends at most 6). A row lives <= n steps: relative error < ~2n * 2^-52 / REFRESH_BELOW
#: (5e-7 at n = 1024).
REFRESH_BELOW = 2.0**-20


def retroactive_reason(attention: attn.Attention, causal: bool = False) -> str | None:
    """Why the retroactive update is not exact for ``attention`` (one line), or None."""
    pattern = attention.pattern()
    if not pattern.exact:
        return f"{pattern.name} is an approximation, not a softmax over the window's keys"
    if pattern.native is not None:
        return f"{pattern.name} runs its own implementation, not a softmax over the window's keys"
    if causal or pattern.always_causal:
        return f"{pattern.name} is causal: a query's keys are not the whole window"
    if pattern.mask_mod is not None:
        return f"{pattern.name} has a mask_mod: a query's keys are not the whole window"
    if pattern.score_mod is not None:
        return f"{pattern.name} has a score_mod (a position bias): the scores are not q.k alone"
    return None


def exact_rows(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax sums from scratch, float64: row maxima ``m (..., T)``, ``den (..., T)``, ``num (..., T, Dv)``."""
    scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * scale  # (..., T, N)
    m = scores.amax(dim=-1)  # (..., T)
    weights = torch.exp(scores - m[..., None])  # (..., T, N)
    return m, weights.sum(dim=-1), torch.matmul(weights, v.double())


class RetroactiveSoftmax:
    """The softmax sums of every query of a FIFO window of ``window`` tokens, in float64 ring buffers
    (the ``c``-th token pushed sits in slot ``c % window``); ``peak``: the largest ``den`` since exact."""

    def __init__(self, window: int, head_dim: int) -> None:
        self.window = window
        self.scale = 1.0 / math.sqrt(head_dim)
        self.count = 0  # tokens pushed since fill (0: empty)
        self.refreshed = 0  # rows recomputed exactly by the last step

    @property
    def length(self) -> int:
        return min(self.count, self.window)

    def clear(self) -> None:
        self.count = 0
        self.refreshed = 0

    def fill(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        """Start from the window's per-head ``q, k, v (B, H, T, D)`` (the last ``window`` kept)."""
        q, k, v = (x[:, :, -self.window :] for x in (q, k, v))
        batch, heads, length, _ = q.shape
        shape = (batch, heads, self.window)
        self.q = q.new_zeros((*shape, q.shape[-1]), dtype=torch.float64)  # (B, H, n, D) ring
        self.k = k.new_zeros((*shape, k.shape[-1]), dtype=torch.float64)
        self.v = v.new_zeros((*shape, v.shape[-1]), dtype=torch.float64)  # (B, H, n, Dv)
        self.m = q.new_zeros(shape, dtype=torch.float64)  # (B, H, n)
        self.den, self.peak = torch.ones_like(self.m), torch.ones_like(self.m)
        self.num = torch.zeros_like(self.v)  # (B, H, n, Dv)
        self.q[:, :, :length], self.k[:, :, :length], self.v[:, :, :length] = q, k, v
        self.m[:, :, :length], self.den[:, :, :length], self.num[:, :, :length] = exact_rows(
            q, k, v, self.scale)
        self.peak[:, :, :length] = self.den[:, :, :length]
        self.count, self.refreshed = length, 0

    def step(self, q_new: Tensor, k_new: Tensor, v_new: Tensor) -> Tensor:
        """Push one token's ``q_new, k_new, v_new (B, H, 1, D)``; return all outputs oldest first, ``(B, H, T, Dv)``."""
        if self.count == 0:
            self.fill(q_new, k_new, v_new)
            return self.outputs(q_new.dtype)
        slot, full = self.count % self.window, self.count >= self.window
        live = slice(0, self.window if full else self.count)  # the rows and keys before the push
        q, m, den, num = self.q[:, :, live], self.m[:, :, live], self.den[:, :, live], self.num[:, :, live]
        if full:  # the oldest key (in the new token's slot) leaves every row
            gone = torch.exp(self._scores(q, self.k[:, :, slot]) - m)  # (B, H, T)
            den.sub_(gone)
            num.sub_(gone[..., None] * self.v[:, :, slot, None])  # (B, H, T, Dv)
        s = self._scores(q, k_new[:, :, 0].double())  # (B, H, T)
        m_new = torch.maximum(m, s)
        old, new = torch.exp(m - m_new), torch.exp(s - m_new)  # (B, H, T)
        m.copy_(m_new)
        den.mul_(old).add_(new)
        num.mul_(old[..., None]).add_(new[..., None] * v_new.double())  # (B, H, T, Dv)
        peak = self.peak[:, :, live]  # (B, H, T), rescaled with the sums
        peak.copy_(torch.maximum(peak * old, den))
        self.q[:, :, slot], self.k[:, :, slot], self.v[:, :, slot] = q_new[:, :, 0], k_new[:, :, 0], v_new[:, :, 0]
        self.count += 1
        live = slice(0, self.length)  # after the push
        self._set_rows(slot, *exact_rows(self.q[:, :, slot, None], self.k[:, :, live], self.v[:, :, live],
                                         self.scale))  # the new query's row
        self._refresh()
        return self.outputs(q_new.dtype)

    def outputs(self, dtype: torch.dtype) -> Tensor:
        """The attention outputs of the window's queries, oldest first, ``(B, H, T, Dv)``."""
        out = (self.num / self.den[..., None]).to(dtype)  # (B, H, n, Dv), ring order
        if self.count <= self.window:
            return out[:, :, : self.count]
        return torch.roll(out, -(self.count % self.window), dims=2)  # oldest first

    def _scores(self, q: Tensor, key: Tensor) -> Tensor:
        return torch.matmul(q, key[..., None])[..., 0] * self.scale

    def _set_rows(self, rows: Any, m: Tensor, den: Tensor, num: Tensor) -> None:
        """``rows``: a slot index, or ``(b, h, t)``."""
        index = (slice(None), slice(None), rows) if isinstance(rows, int) else rows
        squeeze = isinstance(rows, int)
        self.m[index] = m[..., 0] if squeeze else m
        self.den[index] = den[..., 0] if squeeze else den
        self.peak[index] = den[..., 0] if squeeze else den
        self.num[index] = num[..., 0, :] if squeeze else num

    def _refresh(self) -> None:
        live = slice(0, self.length)
        stale = self.den[:, :, live] < self.peak[:, :, live] * REFRESH_BELOW  # (B, H, T)
        self.refreshed = int(stale.sum())
        if not self.refreshed:
            return
        b, h, t = stale.nonzero(as_tuple=True)
        m, den, num = exact_rows(self.q[b, h, t][:, None], self.k[b, h, live], self.v[b, h, live], self.scale)
        self._set_rows((b, h, t), m[:, 0], den[:, 0], num[:, 0])
