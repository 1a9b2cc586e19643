"""Kernelized (feature-map) attention ``phi(q) phi(k)^T v / phi(q) phi(k)^T 1`` in O(N * F * Dv), the core of
linear-cost approximations (Katharopoulos et al. 2020; Performer, Choromanski et al. 2021; docs/extending.md)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attn.contract import check_decoding_step
from attn.cost import Cost, CostQuery, matmul_flops

#: query rows per chunk of the causal prefix-sum form: C x C products inside a chunk
CAUSAL_CHUNK = 128

#: rows per feature slice of :func:`streamed_kernelized_attention`: small temporaries come back from the
#: allocator's cache, where whole-length ones are fresh pages (a page fault each on CPU)
STREAM_ROWS = 2048

FeatureMap = Callable[[Tensor, bool], Tensor]  # (x (B, H, N, D), is_query) -> (B, H, N, F)


def _masked(phi_k: Tensor, key_mask: Tensor | None) -> Tensor:
    """Zero the features of padded keys: ``phi_k (B, H, Nk, F)``, ``key_mask (B, Nk)``."""
    return phi_k if key_mask is None else phi_k * key_mask[:, None, :, None].to(phi_k.dtype)


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num (..., Dv) / den (...)``, zeros where ``den`` is 0 (no allowed key)."""
    den = den.unsqueeze(-1)  # (..., 1)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, num / safe, torch.zeros_like(num))


def _causal_chunks(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, state: Tensor, norm: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """Causal numerator and denominator of aligned rows, from the ``state``, ``norm`` of earlier keys."""
    batch, heads, length, feats = phi_q.shape
    chunk = max(1, min(chunk, length))  # a one-token step pads nothing
    pad = (-length) % chunk
    if pad:
        phi_q, phi_k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    count = (length + pad) // chunk
    qc = phi_q.view(batch, heads, count, chunk, feats)  # (B, H, C#, C, F)
    kc = phi_k.view(batch, heads, count, chunk, feats)
    vc = v.reshape(batch, heads, count, chunk, v.shape[-1])  # (B, H, C#, C, Dv)
    chunk_state = kc.transpose(-2, -1) @ vc  # (B, H, C#, F, Dv)
    chunk_norm = kc.sum(dim=-2)  # (B, H, C#, F)
    # exclusive prefix sums across chunks: what every earlier chunk (and the given state) holds
    before = torch.cumsum(chunk_state, dim=2) - chunk_state + state.unsqueeze(2)  # (B, H, C#, F, Dv)
    before_norm = torch.cumsum(chunk_norm, dim=2) - chunk_norm + norm.unsqueeze(2)  # (B, H, C#, F)
    inner = (qc @ kc.transpose(-2, -1)).tril()  # (B, H, C#, C, C): j <= i inside the chunk
    num = inner @ vc + qc @ before  # (B, H, C#, C, Dv)
    den = inner.sum(dim=-1) + (qc @ before_norm.unsqueeze(-1)).squeeze(-1)  # (B, H, C#, C)
    num = num.reshape(batch, heads, count * chunk, -1)[:, :, :length]  # (B, H, N, Dv)
    den = den.reshape(batch, heads, count * chunk)[:, :, :length]  # (B, H, N)
    return num, den


def kernelized_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    chunk: int = CAUSAL_CHUNK,
) -> Tensor:
    """Feature-map attention in linear time: ``phi_q (B, H, Nq, F)``, ``phi_k (B, H, Nk, F)``
    (non-negative), ``v (B, H, Nk, Dv)`` -> ``(B, H, Nq, Dv)``; causal bottom-right aligned."""
    phi_k = _masked(phi_k, key_mask)
    if not causal:
        kv = phi_k.transpose(-2, -1) @ v  # (B, H, F, Dv)
        den = (phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)).squeeze(-1)  # (B, H, Nq)
        return _ratio(phi_q @ kv, den)
    q_len, k_len = phi_q.shape[2], phi_k.shape[2]
    offset = k_len - q_len  # query row r sits at key position offset + r
    if offset < 0:  # the first -offset rows sit before every key: zeros
        out = kernelized_attention(phi_q[:, :, -offset:], phi_k, v, causal=True, chunk=chunk)
        zeros = out.new_zeros(*out.shape[:2], -offset, out.shape[-1])
        return torch.cat([zeros, out], dim=2)
    state = phi_k[:, :, :offset].transpose(-2, -1) @ v[:, :, :offset]  # (B, H, F, Dv): keys every row sees
    norm = phi_k[:, :, :offset].sum(dim=-2)  # (B, H, F)
    num, den = _causal_chunks(phi_q, phi_k[:, :, offset:], v[:, :, offset:], state, norm, chunk)
    return _ratio(num, den)


def streamed_kernelized_attention(
    features: FeatureMap,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_mask: Tensor | None = None,
    rows: int = STREAM_ROWS,
) -> Tensor:
    """Non-causal :func:`kernelized_attention` with the features computed ``rows`` rows at a time (the feature map
    must treat each row on its own, as elu + 1 and Performer's features do)."""
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    state, norm = None, None  # sum phi_k v^T (B, H, F, Dv), sum phi_k (B, H, F)
    for start in range(0, k_len, rows):
        phi_k = features(k[:, :, start : start + rows], False)  # (B, H, r, F)
        if key_mask is not None:
            phi_k = _masked(phi_k, key_mask[:, start : start + rows])
        part, part_norm = phi_k.transpose(-2, -1) @ v[:, :, start : start + rows], phi_k.sum(dim=-2)
        state = part if state is None else state + part
        norm = part_norm if norm is None else norm + part_norm
    out = v.new_empty(batch, heads, q_len, v.shape[-1])  # (B, H, Nq, Dv)
    for start in range(0, q_len, rows):
        phi_q = features(q[:, :, start : start + rows], True)  # (B, H, r, F)
        if state is None:  # no key: zeros, as in kernelized_attention
            out[:, :, start : start + rows] = 0.0
            continue
        den = (phi_q @ norm.unsqueeze(-1)).squeeze(-1)  # (B, H, r)
        out[:, :, start : start + rows] = _ratio(phi_q @ state, den)
    return out


def dense_kernelized_attention(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> Tensor:
    """The same definition computed directly in O(Nq * Nk), for checks."""
    scores = phi_q @ _masked(phi_k, key_mask).transpose(-2, -1)  # (B, H, Nq, Nk)
    if causal:
        q_len, k_len = phi_q.shape[2], phi_k.shape[2]
        rows = torch.arange(q_len, device=phi_q.device)[:, None] + (k_len - q_len)  # (Nq, 1)
        allowed = torch.arange(k_len, device=phi_q.device)[None, :] <= rows  # (Nq, Nk)
        scores = scores * allowed.to(scores.dtype)
    return _ratio(scores @ v, scores.sum(dim=-1))


class KernelizedState:
    """The O(1)-per-token decoding state of a feature-map attention: ``S = sum phi_k v^T`` and
    ``z = sum phi_k`` over every key fed so far."""

    def __init__(self, features: FeatureMap, chunk: int = CAUSAL_CHUNK) -> None:
        self.features = features
        self.chunk = chunk
        self.state: Tensor | None = None  # (B, H, F, Dv)
        self.norm: Tensor | None = None  # (B, H, F)
        self.seen = 0  # keys fed so far (the absolute position of the next one)

    @property
    def length(self) -> int:
        return self.seen

    def step(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Feed ``k, v (B, H, Nnew, .)`` and return causal attention of ``q`` over all keys: ``(B, H, Nnew, Dv)``."""
        check_decoding_step(q.shape[2], k.shape[2])
        phi_q, phi_k = self.features(q, True), _masked(self.features(k, False), key_mask)
        if self.state is None:
            batch, heads, _, feats = phi_k.shape
            self.state = phi_k.new_zeros(batch, heads, feats, v.shape[-1])
            self.norm = phi_k.new_zeros(batch, heads, feats)
        num, den = _causal_chunks(phi_q, phi_k, v.to(phi_k.dtype), self.state, self.norm, self.chunk)
        self.state = self.state + phi_k.transpose(-2, -1) @ v.to(phi_k.dtype)
        self.norm = self.norm + phi_k.sum(dim=-2)
        self.seen += k.shape[2]
        return _ratio(num, den).to(v.dtype)

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search): ``index (B',)``."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)
            self.norm = self.norm.index_select(0, index)


def kernelized_cost(query: CostQuery, features: int, feature_flops: int = 0, chunk: int = CAUSAL_CHUNK) -> Cost:
    """The matmuls :func:`kernelized_attention` performs (``kind="performed"``), plus ``feature_flops``
    per token; backward twice the forward."""
    q_len, k_len, dv, f = query.q_len, query.k_len, query.v_dim, features
    fwd = matmul_flops(f, k_len, dv) + matmul_flops(q_len, f, dv + 1)
    if query.causal:
        c = max(1, min(chunk, q_len))
        fwd += matmul_flops(q_len, f, c) + matmul_flops(q_len, c, dv)
    fwd += feature_flops * (q_len + k_len)
    heads = query.batch * query.heads
    return Cost(heads * fwd, 2 * heads * fwd, "performed")
