"""RetNet retention (Sun et al. 2023, "Retentive Network"): an attn-bench plug-in.

Per head ``h`` a fixed decay ``gamma_h = 1 - exp(linspace(log(1/32), log(1/512), H))[h]`` (the
paper's ``1 - 2^(-5 - h)`` schedule spread over the model's heads, ``1 - 1/32`` to ``1 - 1/512``),
and, with ``q`` scaled by ``D^-1/2``,

    R_ij = gamma^(i - j) (q_i . k_j) / sqrt(D)   (j <= i),   out_i = sum_j R_ij v_j / max(|sum_j R_ij|, 1)

which is the recurrence ``S_i = gamma S_{i-1} + k_i^T v_i``, ``out_i = q_i S_i / sqrt(D)`` (normalised).
The normaliser is the paper's retention-score normalisation ``max(|sum_j R_ij|, 1)``
(``normalize=True``, the default; ``normalize=False`` leaves it out). It is the absolute value
of a sum, ``q_i . z_i`` with ``z_i = sum_j gamma^(i - j) k_j``, so decoding keeps it in the same
state (a column of ones appended to ``v``). The sum of absolute weights (which the authors'
code uses in its parallel form) is not a function of such a state, so it is not used; nor is
the decay mask's own row normalisation ``1 / sqrt(sum_j gamma^(i - j))``, or the GroupNorm
that RetNet applies after retention (that belongs to the layer, not to the mixer).

Training runs chunk by chunk: inside a chunk of ``C`` tokens the ``C x C`` products with the decay
mask ``exp(b_i - b_j)`` (``b`` the cumulative log decay, so no power of ``gamma`` is formed), the
state carried across chunks; half inputs are computed in float32. Causal only (``forces_causal``):
a non-causal call (an encoder) runs causally, as the ``causal`` variant does. A padded key
(``key_mask`` False) is skipped: it adds nothing to the state and does not decay it, so a row's
output is that of its sequence without the padding; a row with no real key gives zeros.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from attn import KernelPath
from attn.cost import Cost, CostQuery, matmul_flops
from attn.recurrence import RecurrentAttention, decayed_chunks, dense_decayed
from attn.validation import Param


def retention_log_decay(heads: int, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """``log gamma_h`` per head, ``gamma = 1 - exp(linspace(log(1/32), log(1/512), H))``: ``(H,)``,
    made on ``device`` (no copy from the host in a call)."""
    rate = torch.linspace(math.log(1 / 32), math.log(1 / 512), heads, dtype=dtype, device=device)  # (H,)
    return torch.log1p(-rate.exp())


def decayed_cost(query: CostQuery, chunk: int, v_dim: int) -> Cost:
    """FLOPs of :func:`decayed_chunks` over the ``Nk`` keys (queries aligned to them); backward twice the forward."""
    length, dim = query.k_len, query.head_dim
    c = max(1, min(chunk, length))
    padded = -(-length // c) * c
    fwd = (matmul_flops(padded, dim, c) + matmul_flops(padded, c, v_dim)  # inside chunks
           + 2 * matmul_flops(padded, dim, v_dim)  # chunk states, queries' reads of them
           + 2 * (padded // c) * dim * v_dim)  # the state carried
    heads = query.batch * query.heads
    return Cost(heads * fwd, 2 * heads * fwd, "performed")


class RetentionAttention(RecurrentAttention):
    """RetNet retention: fixed per-head decay, chunkwise training, O(D * Dv) decoding state; always causal."""

    name: ClassVar[str] = "retention"
    example_params = ({"chunk": 8}, {"chunk": 64}, {"chunk": 8, "normalize": False})
    param_rules: ClassVar[dict[str, Param]] = {
        "chunk": Param(minimum=1), "normalize": Param(choices=(True, False)),
    }

    def __init__(self, chunk: int = 64, normalize: bool = True, **common) -> None:
        self.check_params(chunk=chunk, normalize=normalize)
        super().__init__(**common)
        self.chunk = chunk  # tokens per chunk: C x C products inside, the state across chunks
        self.normalize = normalize

    def native_path(self) -> KernelPath:
        norm = ", normalised" if self.normalize else ""
        return KernelPath("native", f"retention (chunks of {self.chunk}, state across chunks{norm})")

    def prepare(self, q: Tensor, k: Tensor, v: Tensor,
                key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``q D^-1/2``, masked ``k``, ``v`` (a column of ones appended when normalising) in the compute
        dtype, and the log decay ``(B|1, H, Nk)``: 0 at padded keys (skipped)."""
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v = q.to(compute) * q.shape[-1] ** -0.5, k.to(compute), v.to(compute)
        if self.normalize:
            v = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # (B, H, Nk, Dv + 1)
        log_decay = retention_log_decay(k.shape[1], compute, k.device)[None, :, None].expand(
            1, k.shape[1], k.shape[2])  # (1, H, Nk)
        if key_mask is not None:
            real = key_mask[:, None, :]  # (B, 1, Nk)
            k = k * real[..., None].to(compute)
            log_decay = torch.where(real, log_decay, torch.zeros((), dtype=compute, device=k.device))
        return q, k, v, log_decay

    def finish(self, out: Tensor, dtype: torch.dtype) -> Tensor:
        """The normaliser ``max(|sum_j R_ij|, 1)`` (the last column) applied: ``(B, H, Nq, Dv)`` in ``dtype``."""
        if self.normalize:
            out = out[..., :-1] / out[..., -1:].abs().clamp(min=1.0)
        return out.to(dtype)

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None,
                  state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Retention of ``q`` (one query per key, ``Nq == Nk``) from ``state``: the output and the new state."""
        dtype = v.dtype
        q, k, v, log_decay = self.prepare(q, k, v, key_mask)
        out, state = decayed_chunks(q, k, v, log_decay, self.chunk, state)  # (B, H, N, Dv [+ 1])
        return self.finish(out, dtype), state

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
        """The definition computed directly, O(Nq * Nk), with the explicit decay mask; always causal
        (the variant has no other form: every call is run causally)."""
        dtype = v.dtype
        q, k, v, log_decay = self.prepare(q, k, v, key_mask)
        return self.finish(dense_decayed(q, k, v, log_decay), dtype)

    def cost(self, query: CostQuery) -> Cost:
        """The matmuls performed: ``C x C`` products inside chunks, the chunks' states, the queries' reads."""
        return decayed_cost(query, self.chunk, query.v_dim + int(self.normalize))

    def extra_repr(self) -> str:
        return f"chunk={self.chunk}, normalize={self.normalize}, kernel={self.kernel!r}"

