"""Mamba-2's state-space duality, scalar-decay form (Dao and Gu 2024, "Transformers are SSMs:
Generalized Models and Efficient Algorithms Through Structured State Space Duality"): an
attn-bench plug-in.

Per head ``h`` a data-dependent step ``dt_t`` and decay ``a_t``:

    dt_t = softplus(k_t . w_h + dt_bias_h),   a_t = exp(-dt_t exp(A_log_h))
    S_t = a_t S_{t-1} + dt_t k_t^T v_t,   out_t = q_t S_t
    out_t = sum_{s <= t} (prod_{r = s+1..t} a_r) (q_t . k_s) dt_s v_s

(``C = q``, ``B = k``, ``x = v`` in SSM terms; no ``D`` skip term and no ``1/sqrt(D)`` scale, as in
Mamba-2). ``w_h (D,)``, ``dt_bias_h`` and ``A_log_h`` are learned per head. Mamba-2 computes ``dt``
from the layer's input; the suite's interface hands the mixer ``q, k, v`` only, so here ``dt`` is
computed from the key ``k_t``. Initialisation as Mamba-2's: ``A`` uniform in [1, 16], ``dt`` at
``softplus(dt_bias)`` log-uniform in [0.001, 0.1].

Training runs chunk by chunk (the SSD algorithm): inside a chunk of ``C`` tokens the ``C x C``
products with the decay mask ``exp(b_t - b_s)`` (``b`` the cumulative log decay, a segment sum
formed in log space), the state carried across chunks; half inputs are computed in float32. Causal
only (``forces_causal``): a recurrence reads left to right, so a non-causal call (an encoder) runs
causally, as the built-in ``causal`` variant does. A padded key (``key_mask`` False) is skipped:
``dt = 0`` there, so it adds nothing and does not decay the state, and a row's output is that of
its sequence without the padding; a row with no real key gives zeros.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attn import Attention, KernelPath
from attn.cost import Cost, CostQuery, matmul_flops
from attn.validation import Param

#: Mamba-2's initial ranges: A = exp(A_log) uniform in [1, 16], dt = softplus(dt_bias) log-uniform
A_INIT_RANGE = (1.0, 16.0)
DT_INIT_RANGE = (0.001, 0.1)


def decayed_chunks(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, chunk: int, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``out_t = q_t S_t``, ``S_t = exp(g_t) S_{t-1} + k_t^T v_t`` chunk by chunk, from ``state``.

    ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)``, ``log_decay g (B|1, H, N) <= 0``, ``state
    (B, H, D, Dv)`` or None (zeros) -> ``out (B, H, N, Dv)`` and the state after the last token."""
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
    # decay from key s to query t, exp(b_t - b_s) <= 1, formed in log space
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
    states = chunk_state.unbind(dim=2)  # n x (B, H, D, Dv)
    for decay, added in zip(decays, states, strict=True):  # the state each chunk starts from
        before.append(state)
        state = decay * state + added  # (B, H, D, Dv)
    out = out + (qc * b.exp()[..., None]) @ torch.stack(before, dim=2)  # (B, H, n, C, Dv)
    return out.reshape(batch, heads, count * chunk, -1)[:, :, :length], state


def dense_decayed(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor) -> Tensor:
    """The same recurrence written as one O(Nq * Nk) product with the explicit decay mask,
    bottom-right aligned (query row r at key position ``Nk - Nq + r``; before every key: zeros).

    ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)``, ``log_decay (B|1, H, Nk)``."""
    q_len, k_len = q.shape[2], k.shape[2]
    cum = log_decay.cumsum(dim=-1)  # (B|1, H, Nk)
    pos = torch.arange(q_len, device=q.device) + (k_len - q_len)  # (Nq,): each row's key position
    keys = torch.arange(k_len, device=q.device)
    allowed = keys[None, :] <= pos[:, None]  # (Nq, Nk)
    row_cum = cum[..., pos.clamp(min=0)]  # (B|1, H, Nq)
    log_mask = (row_cum[..., :, None] - cum[..., None, :]).masked_fill(~allowed, float("-inf"))
    return ((q @ k.transpose(-2, -1)) * log_mask.exp()) @ v  # (B, H, Nq, Dv)


def aligned(run: Callable[[Tensor], Tensor], q: Tensor, k: Tensor) -> Tensor:
    """Causal bottom-right alignment of a recurrent form ``run(q_full)`` over the ``Nk`` keys:
    ``Nq < Nk`` pads the queries in front (their rows dropped), ``Nq > Nk`` gives zeros to the
    rows before every key."""
    q_len, k_len = q.shape[2], k.shape[2]
    offset = k_len - q_len
    if offset >= 0:
        return run(F.pad(q, (0, 0, offset, 0)))[:, :, offset:]  # (B, H, Nq, Dv)
    out = run(q[:, :, -offset:])  # (B, H, Nk, Dv)
    return torch.cat([out.new_zeros(*out.shape[:2], -offset, out.shape[-1]), out], dim=2)


class SSDState:
    """SSD's decoding state: ``S (B, H, D, Dv)``, so a token costs O(D * Dv) at any context length."""

    def __init__(self, owner: SSDAttention) -> None:
        self.owner = owner
        self.state: Tensor | None = None  # (B, H, D, Dv), float32 for half inputs
        self.seen = 0  # keys fed so far

    @property
    def length(self) -> int:
        """Number of keys fed so far."""
        return self.seen

    def step(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Feed ``k, v (B, H, Nnew, .)`` and return the causal output of ``q`` over all keys: ``(B, H, Nnew, Dv)``."""
        if q.shape[2] != k.shape[2]:
            raise ValueError(f"q: a decoding step takes one query per new key; got Nq={q.shape[2]}, "
                             f"Nk={k.shape[2]}")
        out, self.state = self.owner.recurrent(q, k, v, key_mask, self.state)
        self.seen += k.shape[2]
        return out

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search): ``index (B',)``."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)


class SSDAttention(Attention):
    """Mamba-2 SSD (scalar decay): a learned data-dependent decay per head, chunkwise training,
    O(D * Dv) decoding state; always causal."""

    name: ClassVar[str] = "ssd"
    forces_causal = True  # a recurrence has no non-causal form: an encoder reads left to right
    exact = False
    native_computes_half_in_float32 = True
    example_params = ({"chunk": 8}, {"chunk": 64})
    param_rules: ClassVar[dict[str, Param]] = {"chunk": Param(minimum=1)}

    def __init__(self, chunk: int = 64, **common) -> None:
        self.check_params(chunk=chunk, num_heads=common.get("num_heads"), head_dim=common.get("head_dim"))
        super().__init__(**common)
        self.chunk = chunk  # tokens per chunk: C x C products inside, the state across chunks
        heads, dim = self.num_heads, self.head_dim
        bound = dim**-0.5  # nn.Linear's initialisation
        self.dt_weight = nn.Parameter(nn.init.uniform_(torch.empty(heads, dim), -bound, bound))  # (H, D)
        low, high = (math.log(x) for x in DT_INIT_RANGE)
        dt = torch.exp(torch.empty(heads).uniform_(low, high))  # (H,)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.A_log = nn.Parameter(torch.empty(heads).uniform_(*A_INIT_RANGE).log())  # (H,)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        super().check_together(params)
        for key in ("num_heads", "head_dim"):
            if key in params and params[key] is None:
                raise ValueError(f"{cls.name}: parameter '{key}' is required (dt is a learned map of "
                                 "the key per head)")

    def native_path(self) -> KernelPath:
        return KernelPath("native", f"ssd (chunks of {self.chunk}, state across chunks)")

    def prepare(self, q: Tensor, k: Tensor, v: Tensor,
                key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``q``, ``dt * k``, ``v`` in the compute dtype and the log decay ``-dt exp(A_log)`` ``(B, H, Nk)``;
        ``dt = 0`` at padded keys (skipped)."""
        if k.shape[-1] != self.head_dim:
            raise ValueError(f"{self.name}: arguments 'q', 'k' have head dim {k.shape[-1]} but the module "
                             f"was built with head_dim={self.head_dim}")
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        dt_in = torch.einsum("bhnd,hd->bhn", k, self.dt_weight.to(compute))  # (B, H, Nk)
        dt = F.softplus(dt_in + self.dt_bias.to(compute)[:, None])  # (B, H, Nk)
        if key_mask is not None:
            dt = torch.where(key_mask[:, None, :], dt, torch.zeros((), dtype=compute, device=k.device))
        log_decay = -dt * self.A_log.to(compute).exp()[:, None]  # (B, H, Nk)
        return q, k * dt[..., None], v, log_decay

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None,
                  state: Tensor | None) -> tuple[Tensor, Tensor]:
        """The output of ``q`` (one query per key, ``Nq == Nk``) continuing from ``state``, and the new state."""
        dtype = v.dtype
        q, k, v, log_decay = self.prepare(q, k, v, key_mask)
        out, state = decayed_chunks(q, k, v, log_decay, self.chunk, state)  # (B, H, N, Dv)
        return out.to(dtype), state

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        return aligned(lambda rows: self.recurrent(rows, k, v, key_mask, None)[0], q, k)

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition computed directly, O(Nq * Nk), with the explicit decay mask; always causal
        (the variant has no other form: every call is run causally)."""
        dtype = v.dtype
        q, k, v, log_decay = self.prepare(q, k, v, key_mask)
        return dense_decayed(q, k, v, log_decay).to(dtype)

    def new_decoding_state(self) -> SSDState:
        """Causal decoding through the state ``S``: O(D * Dv) per token at any context length."""
        return SSDState(self)

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls performed over the ``Nk`` keys (queries aligned to them): ``dt``, the
        ``C x C`` products inside chunks, the chunks' states and the queries' reads of them."""
        length, dim, v_dim = query.k_len, query.head_dim, query.v_dim
        c = max(1, min(self.chunk, length))
        padded = -(-length // c) * c
        fwd = (matmul_flops(length, dim, 1) + length * dim  # dt, and dt * k
               + matmul_flops(padded, dim, c) + matmul_flops(padded, c, v_dim)  # inside chunks
               + 2 * matmul_flops(padded, dim, v_dim)  # chunk states, queries' reads of them
               + 2 * (padded // c) * dim * v_dim)  # the state carried
        heads = query.batch * query.heads
        return Cost(heads * fwd, 2 * heads * fwd, "performed")

    def extra_repr(self) -> str:
        return f"chunk={self.chunk}, kernel={self.kernel!r}"
