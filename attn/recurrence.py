"""Recurrent mixers (docs/extending.md, "Recurrent mixers"): :class:`RecurrentAttention`, an always-causal
attention computed as a recurrence over a decoding state, and the chunkwise scalar-decay core that RetNet's
retention (Sun et al. 2023) and Mamba-2's SSD (Dao and Gu 2024) share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional as F

from attn.base import Attention
from attn.contract import check_decoding_step


class RecurrentState:
    """A recurrent mixer's decoding state ``S (B, H, D, Dv)``: a token costs the same at any context length."""

    def __init__(self, owner: RecurrentAttention) -> None:
        self.owner = owner
        self.state: Tensor | None = None  # (B, H, D, Dv), float32 for half inputs
        self.seen = 0  # keys fed so far

    @property
    def length(self) -> int:
        """Number of keys fed so far."""
        return self.seen

    def step(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Feed ``k, v (B, H, Nnew, .)`` and return the causal output of ``q`` over all keys: ``(B, H, Nnew, Dv)``."""
        check_decoding_step(q.shape[2], k.shape[2])
        out, self.state = self.owner.recurrent(q, k, v, key_mask, self.state)
        self.seen += k.shape[2]
        return out

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search): ``index (B',)``."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)


class RecurrentAttention(Attention):
    """An attention that is a recurrence: a subclass writes :meth:`recurrent` (and ``reference_forward``, its
    dense definition for the kit); training runs it over whole sequences, decoding token by token.

    Always causal (``forces_causal``: in an encoder it reads left to right, as the ``causal`` variant does)."""

    forces_causal: ClassVar[bool] = True
    exact: ClassVar[bool] = False
    native_computes_half_in_float32: ClassVar[bool] = True

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None,
                  state: Any | None) -> tuple[Tensor, Any]:
        """The output of ``q`` (one query per key, ``Nq == Nk``) continuing from ``state`` (None: the
        start), and the state after the last key."""
        raise NotImplementedError(f"{self.name}: a recurrent mixer defines recurrent()")

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        return causal_aligned(lambda rows: self.recurrent(rows, k, v, key_mask, None)[0], q, k)

    def new_decoding_state(self) -> RecurrentState:
        """Causal decoding through the recurrent state: a token costs the same at any context length."""
        return RecurrentState(self)


def causal_aligned(run: Callable[[Tensor], Tensor], q: Tensor, k: Tensor) -> Tensor:
    """Causal bottom-right alignment of a recurrent form ``run(q_full)`` over the ``Nk`` keys: ``Nq < Nk``
    pads the queries in front (their rows dropped), ``Nq > Nk`` gives zeros to the rows before every key."""
    offset = k.shape[2] - q.shape[2]
    if offset >= 0:
        return run(F.pad(q, (0, 0, offset, 0)))[:, :, offset:]  # (B, H, Nq, Dv)
    out = run(q[:, :, -offset:])  # (B, H, Nk, Dv)
    return torch.cat([out.new_zeros(*out.shape[:2], -offset, out.shape[-1]), out], dim=2)


def decayed_chunks(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, chunk: int, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``out_t = q_t S_t``, ``S_t = exp(g_t) S_{t-1} + k_t^T v_t`` chunk by chunk, from ``state``.

    ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)``, ``log_decay g (B|1, H, N) <= 0``, ``state (B, H, D, Dv)``
    or None (zeros) -> ``out (B, H, N, Dv)`` and the state after the last token. Inside a chunk of ``C``
    tokens the ``C x C`` products with the decay mask ``exp(b_t - b_s)`` (``b`` the cumulative log decay:
    no power of a decay is formed), the state carried across chunks."""
    batch, heads, length, dim = k.shape
    chunk = max(1, min(chunk, length))  # a one-token step pads nothing
    pad = (-length) % chunk
    if pad:  # padded tokens: no key (k = 0) and no decay (g = 0), so the state passes through
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        log_decay = F.pad(log_decay, (0, pad))
    count = (length + pad) // chunk
    qc = q.reshape(batch, heads, count, chunk, dim)  # (B, H, n, C, D)
    kc = k.reshape(batch, heads, count, chunk, dim)
    vc = v.reshape(batch, heads, count, chunk, v.shape[-1])  # (B, H, n, C, Dv)
    b = log_decay.reshape(log_decay.shape[0], heads, count, chunk).cumsum(dim=-1)  # (B|1, H, n, C)
    rows = torch.arange(chunk, device=q.device)
    later = rows[None, :] > rows[:, None]  # (C, C): key s after query t
    mask = (b[..., :, None] - b[..., None, :]).masked_fill(later, float("-inf")).exp()  # (B|1, H, n, C, C)
    out = ((qc @ kc.transpose(-2, -1)) * mask) @ vc  # (B, H, n, C, Dv): within the chunk
    total = b[..., -1]  # (B|1, H, n): log decay across each whole chunk
    k_end = kc * (total[..., None] - b).exp()[..., None]  # (B, H, n, C, D): keys decayed to the chunk end
    chunk_state = k_end.transpose(-2, -1) @ vc  # (B, H, n, D, Dv)
    if state is None:
        state = q.new_zeros(batch, heads, dim, v.shape[-1])
    before = []
    # unbound once: indexing chunk c inside the loop would make each step's backward fill a whole-length
    # gradient (quadratic in the number of chunks)
    decays = total.exp()[..., None, None].unbind(dim=2)  # n x (B|1, H, 1, 1)
    for decay, added in zip(decays, chunk_state.unbind(dim=2), strict=True):  # the state each chunk starts from
        before.append(state)
        state = decay * state + added  # (B, H, D, Dv)
    out = out + (qc * b.exp()[..., None]) @ torch.stack(before, dim=2)  # (B, H, n, C, Dv)
    return out.reshape(batch, heads, count * chunk, -1)[:, :, :length], state


def dense_decayed(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor) -> Tensor:
    """:func:`decayed_chunks`' recurrence as one O(Nq * Nk) product with the explicit decay mask, bottom-right
    aligned (query row r at key position ``Nk - Nq + r``; before every key: zeros).

    ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)``, ``log_decay (B|1, H, Nk)``."""
    q_len, k_len = q.shape[2], k.shape[2]
    cum = log_decay.cumsum(dim=-1)  # (B|1, H, Nk)
    pos = torch.arange(q_len, device=q.device) + (k_len - q_len)  # (Nq,): each row's key position
    allowed = torch.arange(k_len, device=q.device)[None, :] <= pos[:, None]  # (Nq, Nk)
    row_cum = cum[..., pos.clamp(min=0)]  # (B|1, H, Nq)
    log_mask = (row_cum[..., :, None] - cum[..., None, :]).masked_fill(~allowed, float("-inf"))
    return ((q @ k.transpose(-2, -1)) * log_mask.exp()) @ v  # (B, H, Nq, Dv)
