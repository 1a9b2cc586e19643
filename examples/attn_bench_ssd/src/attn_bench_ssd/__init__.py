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
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attn import KernelPath
from attn.cost import Cost, CostQuery, matmul_flops
from attn.recurrence import RecurrentAttention, decayed_chunks, dense_decayed
from attn.validation import Param

#: Mamba-2's initial ranges: A = exp(A_log) uniform in [1, 16], dt = softplus(dt_bias) log-uniform
A_INIT_RANGE = (1.0, 16.0)
DT_INIT_RANGE = (0.001, 0.1)


class SSDAttention(RecurrentAttention):
    """Mamba-2 SSD (scalar decay): a learned data-dependent decay per head, chunkwise training,
    O(D * Dv) decoding state; always causal."""

    name: ClassVar[str] = "ssd"
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

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition computed directly, O(Nq * Nk), with the explicit decay mask; always causal
        (the variant has no other form: every call is run causally)."""
        dtype = v.dtype
        q, k, v, log_decay = self.prepare(q, k, v, key_mask)
        return dense_decayed(q, k, v, log_decay).to(dtype)

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
