"""Retroactive softmax attention over a sliding window, updated in O(n * d) per step.

After Hedegaard et al. 2023, "Continual Transformers" (their Retroactive Continual
Attention): every query of the window keeps its softmax numerator ``sum_j e^(s_ij) v_j``
(the paper's ``AV_mem``) and denominator ``sum_j e^(s_ij)`` (``d_mem``); a step adds the
new key's term to every row, removes the leaving key's term, drops the leaving query's row
and computes the new query's row, so all ``n`` outputs of the window are updated with
O(n * d) work instead of O(n^2 * d).

This is exact only for plain softmax attention: every key of the window allowed for every
query (no ``mask_mod``, not causal) and no score term (no ``score_mod``, e.g. no position
bias); :func:`retroactive_reason` says why another attention cannot use it.

Numerics: the paper keeps the unnormalised sums ``e^(s_ij)``, which overflow float32 for
scores past ~88. Here each row keeps a running maximum ``m_i`` and the sums relative to it,
``e^(s_ij - m_i)``, in float64 (the rescaling of online softmax, Milakov & Gimelshein 2018).
Removing a key subtracts its term, which loses precision when that key carried most of the
row's weight (cancellation); each row therefore tracks the largest denominator it has had
since it was last computed exactly, and a row whose denominator falls below
:data:`REFRESH_BELOW` of that is recomputed from the window's keys (O(n * d) for that row,
and it resets a stale maximum). A row lives at most ``n`` steps, so its rounding error
stays below ~``2 n * 2^-52 / REFRESH_BELOW`` relative (2e-7 at n = 1024).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

import attn

#: a row whose denominator falls below this fraction of its largest since its last exact
#: computation is recomputed exactly (float64 keeps ~16 digits; this spends at most 6)
REFRESH_BELOW = 2.0**-20


def retroactive_reason(attention: attn.Attention, causal: bool = False) -> str | None:
    """Why the O(n * d) retroactive update is not exact for ``attention`` (one line), or
    None when it is: plain softmax over every key of the window, no score term."""
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


@dataclass(frozen=True)
class SoftmaxSums:
    """Per-query softmax sums over the window's keys, float64, relative to ``m``.

    ``m (B, H, T)`` row maxima (an upper bound of the row's scores), ``den (B, H, T)``
    ``sum_j e^(s_ij - m_i)``, ``num (B, H, T, Dv)`` ``sum_j e^(s_ij - m_i) v_j``, ``peak
    (B, H, T)`` the largest ``den`` since the row was computed exactly (same scale).
    """

    m: Tensor
    den: Tensor
    num: Tensor
    peak: Tensor

    def outputs(self, dtype: torch.dtype) -> Tensor:
        """The attention outputs of the rows, ``(B, H, T, Dv)`` in ``dtype``."""
        return (self.num / self.den[..., None]).to(dtype)  # (B, H, T, Dv)


def exact_sums(q: Tensor, k: Tensor, v: Tensor, scale: float) -> SoftmaxSums:
    """The sums of queries ``q (B, H, T, D)`` over keys ``k (B, H, N, D)``, values
    ``v (B, H, N, Dv)``, from scratch (O(T * N * D))."""
    scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * scale  # (B, H, T, N)
    m = scores.amax(dim=-1)  # (B, H, T)
    weights = torch.exp(scores - m[..., None])  # (B, H, T, N)
    den = weights.sum(dim=-1)  # (B, H, T)
    return SoftmaxSums(m, den, torch.matmul(weights, v.double()), den)


class RetroactiveSoftmax:
    """The softmax sums of every query of a FIFO window of ``window`` tokens.

    :meth:`fill` starts from a window (O(n^2 * d), once); each :meth:`step` pushes one token's
    per-head ``q, k, v (B, H, 1, D)`` given the window's buffers before the push, and returns
    the new outputs of all its queries (O(n * d), plus the rows it refreshes).
    """

    def __init__(self, window: int, head_dim: int) -> None:
        self.window = window
        self.scale = 1.0 / math.sqrt(head_dim)
        self.sums: SoftmaxSums | None = None
        self.refreshed = 0  # rows recomputed exactly by the last step

    def clear(self) -> None:
        """Forget the window."""
        self.sums = None
        self.refreshed = 0

    def fill(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        """Start from the window's ``q, k, v (B, H, T, D)`` (T <= window)."""
        self.sums = exact_sums(q, k, v, self.scale)
        self.refreshed = 0

    def step(
        self, q: Tensor | None, k: Tensor | None, v: Tensor | None,
        q_new: Tensor, k_new: Tensor, v_new: Tensor,
    ) -> Tensor:
        """Push the token ``q_new, k_new, v_new (B, H, 1, D)`` onto the window whose buffers
        are ``q, k, v (B, H, T, D)`` (before the push, the ones :meth:`fill` or the previous
        steps saw; None when empty); the oldest token leaves when ``T == window``. Returns the
        outputs of the window after the push, ``(B, H, T', Dv)`` in ``q_new``'s dtype."""
        if self.sums is None or q is None:
            self.fill(q_new, k_new, v_new)
            return self.sums.outputs(q_new.dtype)
        sums = self.sums
        if q.shape[2] == self.window:  # the oldest query leaves, and its key leaves every other row
            k_old, v_old = k[:, :, :1], v[:, :, :1]  # (B, H, 1, D)
            q, k, v = q[:, :, 1:], k[:, :, 1:], v[:, :, 1:]  # (B, H, T-1, D)
            sums = SoftmaxSums(*(t[:, :, 1:] for t in (sums.m, sums.den, sums.num, sums.peak)))
            sums = self._remove(sums, q, k_old, v_old)
        sums = self._add(sums, q, k_new, v_new)  # rows of the old queries: (B, H, T-1|T, ...)
        keys, values = torch.cat([k, k_new], dim=2), torch.cat([v, v_new], dim=2)  # (B, H, T', D)
        new_row = exact_sums(q_new, keys, values, self.scale)  # (B, H, 1, ...)
        sums = SoftmaxSums(*(torch.cat([a, b], dim=2) for a, b in zip(
            (sums.m, sums.den, sums.num, sums.peak),
            (new_row.m, new_row.den, new_row.num, new_row.peak), strict=True)))
        self.sums = self._refresh(sums, torch.cat([q, q_new], dim=2), keys, values)
        return self.sums.outputs(q_new.dtype)

    def _add(self, sums: SoftmaxSums, q: Tensor, k_new: Tensor, v_new: Tensor) -> SoftmaxSums:
        """Add key ``k_new (B, H, 1, D)`` and value ``v_new`` to the rows of ``q (B, H, T, D)``."""
        s = torch.matmul(q.double(), k_new.double().transpose(-2, -1))[..., 0] * self.scale  # (B, H, T)
        m = torch.maximum(sums.m, s)  # (B, H, T)
        old, new = torch.exp(sums.m - m), torch.exp(s - m)  # (B, H, T)
        den = sums.den * old + new
        num = sums.num * old[..., None] + new[..., None] * v_new.double()  # (B, H, T, Dv)
        return SoftmaxSums(m, den, num, torch.maximum(sums.peak * old, den))

    def _remove(self, sums: SoftmaxSums, q: Tensor, k_old: Tensor, v_old: Tensor) -> SoftmaxSums:
        """Remove key ``k_old (B, H, 1, D)`` and value ``v_old`` from the rows of ``q``."""
        s = torch.matmul(q.double(), k_old.double().transpose(-2, -1))[..., 0] * self.scale  # (B, H, T)
        gone = torch.exp(s - sums.m)  # (B, H, T)
        den = sums.den - gone
        num = sums.num - gone[..., None] * v_old.double()  # (B, H, T, Dv)
        return SoftmaxSums(sums.m, den, num, sums.peak)

    def _refresh(self, sums: SoftmaxSums, q: Tensor, k: Tensor, v: Tensor) -> SoftmaxSums:
        """Recompute exactly the rows whose denominator cancelled below :data:`REFRESH_BELOW`
        of its peak (``q (B, H, T, D)`` the rows' queries, ``k, v`` the window's)."""
        stale = sums.den < sums.peak * REFRESH_BELOW  # (B, H, T)
        self.refreshed = int(stale.sum())
        if not self.refreshed:
            return sums
        b, h, t = stale.nonzero(as_tuple=True)
        fresh = exact_sums(q[b, h, t][:, None, None], k[b, h][:, None], v[b, h][:, None], self.scale)
        m, den, num, peak = (x.clone() for x in (sums.m, sums.den, sums.num, sums.peak))
        m[b, h, t], den[b, h, t] = fresh.m[:, 0, 0], fresh.den[:, 0, 0]
        num[b, h, t], peak[b, h, t] = fresh.num[:, 0, 0], fresh.den[:, 0, 0]
        return SoftmaxSums(m, den, num, peak)
