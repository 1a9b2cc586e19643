"""Gated linear attention (Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"): an attn-bench plug-in.

A linear-attention state with a data-dependent decay per key channel:

    S_t = diag(alpha_t) S_{t-1} + k_t^T v_t,   out_t = q_t S_t / sqrt(D),
    alpha_t = sigmoid(k_t W_h + b_h)^(1 / tau),   tau = 16

``W_h (D, D)``, ``b_h (D,)`` are learned per head (``gate_weight``, ``gate_bias``). The paper
computes the gate from the layer's input ``x_t`` through a low-rank map; the suite's interface
hands the mixer ``q, k, v`` only, so here the gate is computed from the key ``k_t`` (a full
``D x D`` map per head). ``q`` is scaled by ``D^-1/2``, as the authors' implementation does.

Training runs chunk by chunk, as the paper's chunkwise algorithm with its secondary level: the
state is carried across chunks of ``C`` tokens; inside a chunk, sub-blocks of ``c = gcd(C, 16)``
tokens interact through products whose two factors are each decayed to the start of the query's
sub-block (both ``<= 1``), and the pairs inside a sub-block get their ``(c, c, D)`` decays
``exp(b_i - b_j)`` formed exactly (``b`` the cumulative log gate). No factor ``exp(-b)`` is ever
formed, so no gate, however small, overflows; half inputs are computed in float32. Memory beyond
the inputs: about ``N * D * (c + C / c)`` per head. Causal only (``forces_causal``): a recurrence
reads left to right, so a non-causal call (an encoder) runs causally, as the built-in ``causal``
variant does. A padded key (``key_mask`` False) is skipped: it adds nothing and does not decay the
state (its gate is 1), so a row's output is that of its sequence without the padding; a row with
no real key gives zeros.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attn import KernelPath
from attn.cost import Cost, CostQuery, matmul_flops
from attn.recurrence import RecurrentAttention
from attn.validation import Param

#: the gate's temperature tau: alpha = sigmoid(logits)^(1 / tau), close to 1 (the paper's 16)
GATE_TEMPERATURE = 16
#: the largest sub-block inside a chunk whose pairs get their decays formed exactly (the paper's 16)
SUB_CHUNK = 16


def intra_chunk_scores(qc: Tensor, kc: Tensor, b: Tensor) -> Tensor:
    """``A_ij = sum_d q_id k_jd exp(b_id - b_jd)`` for ``j <= i`` inside each chunk, else 0.

    ``qc, kc, b (..., C, D)`` (``b`` the cumulative log gate inside the chunk, non-increasing)
    -> ``(..., C, C)``. Every exponent formed is ``<= 0`` where it is kept."""
    *lead, chunk, dim = qc.shape
    sub = math.gcd(chunk, SUB_CHUNK)
    blocks = chunk // sub
    qs, ks, bs = (t.reshape(*lead, blocks, sub, dim) for t in (qc, kc, b))  # (..., s, c, D)
    # across sub-blocks: both factors decayed to the point just before the query's sub-block
    ref = torch.cat([torch.zeros_like(bs[..., :1, 0, :]), bs[..., :-1, -1, :]], dim=-2)  # (..., s, D)
    q_ref = qs * (bs - ref[..., None, :]).exp()  # (..., s, c, D)
    starts = torch.arange(blocks, device=qc.device) * sub
    earlier = torch.arange(chunk, device=qc.device)[None, :] < starts[:, None]  # (s, C): key before the block
    k_log = (ref[..., :, None, :] - b[..., None, :, :]).masked_fill(~earlier[..., None], float("-inf"))
    k_ref = kc[..., None, :, :] * k_log.exp()  # (..., s, C, D)
    across = q_ref @ k_ref.transpose(-2, -1)  # (..., s, c, C)
    # inside a sub-block: the (c, c, D) decays themselves
    tri = torch.ones(sub, sub, dtype=torch.bool, device=qc.device).tril()  # (c, c): j <= i
    d_log = (bs[..., :, None, :] - bs[..., None, :, :]).masked_fill(~tri[..., None], float("-inf"))
    within = (qs[..., :, None, :] * ks[..., None, :, :] * d_log.exp()).sum(dim=-1)  # (..., s, c, c)
    eye = torch.eye(blocks, dtype=qc.dtype, device=qc.device)  # (s, s): a block's own columns
    scores = across.reshape(*lead, blocks, sub, blocks, sub) + within[..., :, :, None, :] * eye[:, None, :, None]
    return scores.reshape(*lead, chunk, chunk)


def gated_chunks(
    q: Tensor, k: Tensor, v: Tensor, log_gate: Tensor, chunk: int, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``out_t = q_t S_t``, ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`` chunk by chunk, from ``state``.

    ``q, k, log_gate g (B, H, N, D)`` (``g <= 0``), ``v (B, H, N, Dv)``, ``state (B, H, D, Dv)``
    or None (zeros) -> ``out (B, H, N, Dv)`` and the state after the last token."""
    batch, heads, length, dim = k.shape
    chunk = max(1, min(chunk, length))  # a one-token step pads nothing
    pad = (-length) % chunk
    if pad:  # padded tokens: no key (k = 0) and no decay (g = 0), so the state passes through
        q, k, v, log_gate = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_gate))
    count = (length + pad) // chunk
    qc, kc, gc = (t.reshape(batch, heads, count, chunk, dim) for t in (q, k, log_gate))  # (B, H, n, C, D)
    vc = v.reshape(batch, heads, count, chunk, v.shape[-1])  # (B, H, n, C, Dv)
    b = gc.cumsum(dim=-2)  # (B, H, n, C, D): log decay from the chunk start through each token
    out = intra_chunk_scores(qc, kc, b) @ vc  # (B, H, n, C, Dv): within the chunk
    total = b[..., -1, :]  # (B, H, n, D): log decay across each whole chunk
    k_end = kc * (total[..., None, :] - b).exp()  # (B, H, n, C, D): keys decayed to the chunk end
    chunk_state = k_end.transpose(-2, -1) @ vc  # (B, H, n, D, Dv)
    if state is None:
        state = q.new_zeros(batch, heads, dim, v.shape[-1])
    before = []
    # unbound once: indexing chunk c inside the loop would make each step's backward fill a whole-length
    # gradient (quadratic in the number of chunks)
    decays = total.exp()[..., None].unbind(dim=2)  # n x (B|1, H, D, 1)
    states = chunk_state.unbind(dim=2)  # n x (B, H, D, Dv)
    for decay, added in zip(decays, states, strict=True):  # the state each chunk starts from
        before.append(state)
        state = decay * state + added  # (B, H, D, Dv)
    out = out + (qc * b.exp()) @ torch.stack(before, dim=2)  # (B, H, n, C, Dv)
    return out.reshape(batch, heads, count * chunk, -1)[:, :, :length], state


def dense_gated(q: Tensor, k: Tensor, v: Tensor, log_gate: Tensor) -> Tensor:
    """The same recurrence as one O(Nq * Nk * D) product with the explicit per-channel decay mask,
    bottom-right aligned (query row r at key position ``Nk - Nq + r``; before every key: zeros).

    ``q (B, H, Nq, D)``, ``k, log_gate (B, H, Nk, D)``, ``v (B, H, Nk, Dv)``."""
    q_len, k_len = q.shape[2], k.shape[2]
    cum = log_gate.cumsum(dim=2)  # (B, H, Nk, D)
    pos = torch.arange(q_len, device=q.device) + (k_len - q_len)  # (Nq,): each row's key position
    allowed = torch.arange(k_len, device=q.device)[None, :] <= pos[:, None]  # (Nq, Nk)
    row_cum = cum[:, :, pos.clamp(min=0)]  # (B, H, Nq, D)
    log_mask = (row_cum[:, :, :, None] - cum[:, :, None]).masked_fill(~allowed[..., None], float("-inf"))
    scores = torch.einsum("bhid,bhjd,bhijd->bhij", q, k, log_mask.exp())  # (B, H, Nq, Nk)
    return scores @ v  # (B, H, Nq, Dv)


class GatedLinearAttention(RecurrentAttention):
    """Gated linear attention: a learned per-channel decay from the key, chunkwise training,
    O(D * Dv) decoding state; always causal."""

    name: ClassVar[str] = "gla"
    example_params = ({"chunk": 8}, {"chunk": 64})
    param_rules: ClassVar[dict[str, Param]] = {"chunk": Param(minimum=1)}

    def __init__(self, chunk: int = 64, **common) -> None:
        self.check_params(chunk=chunk, num_heads=common.get("num_heads"), head_dim=common.get("head_dim"))
        super().__init__(**common)
        self.chunk = chunk  # tokens per chunk: the state is carried across chunks
        heads, dim = self.num_heads, self.head_dim
        bound = dim**-0.5  # nn.Linear's initialisation, one (D, D) map per head
        self.gate_weight = nn.Parameter(nn.init.uniform_(torch.empty(heads, dim, dim), -bound, bound))  # (H, D, D)
        self.gate_bias = nn.Parameter(nn.init.uniform_(torch.empty(heads, dim), -bound, bound))  # (H, D)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        super().check_together(params)
        for key in ("num_heads", "head_dim"):
            if key in params and params[key] is None:
                raise ValueError(f"{cls.name}: parameter '{key}' is required (the gate is a learned "
                                 "(head_dim, head_dim) map per head)")

    def native_path(self) -> KernelPath:
        sub = math.gcd(self.chunk, SUB_CHUNK)
        return KernelPath("native", f"gated linear attention (chunks of {self.chunk}, sub-blocks of {sub}, "
                                    "state across chunks)")

    def prepare(self, q: Tensor, k: Tensor, v: Tensor,
                key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``q D^-1/2``, masked ``k``, ``v`` in the compute dtype, and the log gate ``(B, H, Nk, D)``:
        ``log sigmoid(k W + b) / tau``, 0 at padded keys (skipped)."""
        if k.shape[-1] != self.head_dim:
            raise ValueError(f"{self.name}: arguments 'q', 'k' have head dim {k.shape[-1]} but the module "
                             f"was built with head_dim={self.head_dim}")
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v = q.to(compute) * q.shape[-1] ** -0.5, k.to(compute), v.to(compute)
        logits = torch.einsum("bhnd,hde->bhne", k, self.gate_weight.to(compute))  # (B, H, Nk, D)
        log_gate = F.logsigmoid(logits + self.gate_bias.to(compute)[:, None, :]) / GATE_TEMPERATURE
        if key_mask is not None:
            real = key_mask[:, None, :, None]  # (B, 1, Nk, 1)
            k = k * real.to(compute)
            log_gate = torch.where(real, log_gate, torch.zeros((), dtype=compute, device=k.device))
        return q, k, v, log_gate

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None,
                  state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Attention of ``q`` (one query per key, ``Nq == Nk``) from ``state``: the output and the new state."""
        dtype = v.dtype
        q, k, v, log_gate = self.prepare(q, k, v, key_mask)
        out, state = gated_chunks(q, k, v, log_gate, self.chunk, state)  # (B, H, N, Dv)
        return out.to(dtype), state

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition computed directly, O(Nq * Nk * D), with the explicit per-channel decay mask;
        always causal (the variant has no other form: every call is run causally)."""
        dtype = v.dtype
        q, k, v, log_gate = self.prepare(q, k, v, key_mask)
        return dense_gated(q, k, v, log_gate).to(dtype)

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls performed over the ``Nk`` keys (queries aligned to them): the gate, the
        products inside chunks (across sub-blocks, and the ``(c, c, D)`` products within them),
        the chunks' states and the queries' reads of them."""
        length, dim, v_dim = query.k_len, query.head_dim, query.v_dim
        c = max(1, min(self.chunk, length))
        padded = -(-length // c) * c
        sub = math.gcd(c, SUB_CHUNK)
        fwd = (matmul_flops(length, dim, dim)  # the gate's logits
               + matmul_flops(padded, dim, c) + 3 * padded * sub * dim  # scores across and within sub-blocks
               + matmul_flops(padded, c, v_dim)  # scores @ v
               + 2 * matmul_flops(padded, dim, v_dim)  # chunk states, queries' reads of them
               + 2 * (padded // c) * dim * v_dim)  # the state carried
        heads = query.batch * query.heads
        return Cost(heads * fwd, 2 * heads * fwd, "performed")

    def extra_repr(self) -> str:
        return f"chunk={self.chunk}, kernel={self.kernel!r}"
