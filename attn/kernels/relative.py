"""The ``relative`` kernel: a relative position bias (learned table, ALiBi) through torch's CPU flash kernel in O(N)
memory, the bias with query rows reversed a strided (Hankel) view of one per-head vector of offsets
(docs/kernels.md). References: Press et al. 2022 (ALiBi); Shaw et al. 2018, Raffel et al. 2020; Dao 2023."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import gqa_note
from attn.kernels.base import CPU_FLASH, CPU_FLASH_BACKWARD, Kernel, KernelPath
from attn.kernels.chunked import chunk_rows
from attn.pattern import Pattern, RelativeBias
from attn.precision import upcast, without_autocast

#: query rows per flash call of a causal call (each reads only the keys its rows reach)
CAUSAL_ROWS = 256
#: most query rows per band block of a learned table's gradient, and the scores
#: (B * H * blocks * rows * keys) one batched group of blocks holds: 16 MB in fp32
BAND_ROWS = 64
BAND_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class _Plan:
    """One call's geometry, query rows reversed: pair ``(r', j)`` reads ``vec[r' + j]``, ``vec[t] = b(t - Nk + 1)``."""

    q_len: int
    k_len: int
    causal: bool
    chunks: tuple[tuple[int, int, int], ...]  # (r0, r1, keys): rows [r0, r1) read keys [0, keys)

    @classmethod
    def of(cls, batch: int, heads: int, q_len: int, k_len: int, causal: bool, key_mask: bool,
           device: torch.device) -> _Plan:
        """Query chunks: one for a full unmasked call, ``CAUSAL_ROWS`` rows for causal, fewer with a ``key_mask``."""
        rows = CAUSAL_ROWS if causal else q_len
        if key_mask:
            rows = min(rows, chunk_rows(batch, heads, k_len, device))
        chunks = []
        for r0 in range(0, q_len, rows):
            r1 = min(r0 + rows, q_len)
            keys = min(k_len, k_len - r0) if causal else k_len  # causal: j <= a = Nk - 1 - r'
            if keys > 0:  # rows with no key (causal, Nq > Nk) stay zero
                chunks.append((r0, r1, keys))
        return cls(q_len, k_len, causal, tuple(chunks))


def _offset_vector(bias: RelativeBias, q_len: int, k_len: int, causal: bool,
                   dtype: torch.dtype) -> Tensor:
    """``vec (H, Nq + Nk - 1)``: ``vec[:, t] = b(t - Nk + 1)``, ``-inf`` past the diagonal when causal."""
    with torch.no_grad():
        vec = bias.offsets(-(k_len - 1), q_len - 1, dtype).contiguous()  # (H, L)
        if causal:
            vec[:, k_len:] = float("-inf")  # d > 0
    return vec


def _hankel(vec: Tensor, start: int, rows: int, cols: int) -> Tensor:
    """The view ``(1, H, rows, cols)`` of ``vec (H, L)`` with ``[0, h, r, c] = vec[h, start + r + c]``."""
    return vec.as_strided((1, vec.shape[0], rows, cols), (0, vec.stride(0), 1, 1),
                          vec.storage_offset() + start)


def _chunk_mask(vec: Tensor, pad: Tensor | None, r0: int, r1: int, keys: int) -> Tensor:
    """The additive mask of rows ``[r0, r1)`` over keys ``[0, keys)``: a view of ``vec``, plus ``pad``."""
    mask = _hankel(vec, r0, r1 - r0, keys)  # (1, H, C, keys)
    return mask if pad is None else mask + pad[..., :keys]


def _padding(key_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``key_mask (B, Nk)`` as an additive ``(B, 1, 1, Nk)`` mask (``-inf`` at padding)."""
    if key_mask is None:
        return None
    pad = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device)
    return pad.masked_fill_(~key_mask, float("-inf"))[:, None, None, :]


def _forward(qf: Tensor, k: Tensor, v: Tensor, vec: Tensor, pad: Tensor | None, plan: _Plan,
             scale: float) -> tuple[Tensor, Tensor]:
    """Flash attention of the reversed queries ``qf (B, H, Nq, D)``: ``(out, lse)``, reversed."""
    if len(plan.chunks) == 1 and plan.chunks[0] == (0, plan.q_len, plan.k_len):
        return CPU_FLASH(qf, k, v, 0.0, False, attn_mask=_chunk_mask(vec, pad, 0, plan.q_len, plan.k_len),
                      scale=scale)
    out = qf.new_zeros((*qf.shape[:-1], v.shape[-1]))  # (B, H, Nq, Dv)
    lse = qf.new_zeros(qf.shape[:-1])  # (B, H, Nq)
    for r0, r1, keys in plan.chunks:
        o, s = CPU_FLASH(qf[:, :, r0:r1].contiguous(), k[:, :, :keys], v[:, :, :keys], 0.0, False,
                      attn_mask=_chunk_mask(vec, pad, r0, r1, keys), scale=scale)
        out[:, :, r0:r1], lse[:, :, r0:r1] = o, s
    return out, lse


def _flash_backward(gf: Tensor, qf: Tensor, k: Tensor, v: Tensor, of: Tensor, lse: Tensor,
                    vec: Tensor, pad: Tensor | None, plan: _Plan, scale: float
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """``dq`` (reversed rows), ``dk``, ``dv`` from the flash kernel's backward, chunk by chunk."""
    if len(plan.chunks) == 1 and plan.chunks[0] == (0, plan.q_len, plan.k_len):
        mask = _chunk_mask(vec, pad, 0, plan.q_len, plan.k_len)
        return CPU_FLASH_BACKWARD(gf, qf, k, v, of, lse, 0.0, False, attn_mask=mask, scale=scale)
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(k), torch.zeros_like(v)
    for r0, r1, keys in plan.chunks:
        dqc, dkc, dvc = CPU_FLASH_BACKWARD(
            gf[:, :, r0:r1].contiguous(), qf[:, :, r0:r1].contiguous(), k[:, :, :keys], v[:, :, :keys],
            of[:, :, r0:r1].contiguous(), lse[:, :, r0:r1].contiguous(), 0.0, False,
            attn_mask=_chunk_mask(vec, pad, r0, r1, keys), scale=scale)
        dq[:, :, r0:r1] = dqc
        dk[:, :, :keys] += dkc
        dv[:, :, :keys] += dvc
    return dq, dk, dv


def _band_grad(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor,
               key_mask: Tensor | None, bias: RelativeBias, causal: bool, scale: float) -> Tensor:
    """Sums of ``dS`` on the diagonals ``|d| < M``: ``(H, 2M - 1)`` indexed by ``d + M - 1``.

    Rows are in their own order here. Blocks of ``R`` query rows each read a window of
    ``R + 2M - 2`` keys, so every block sees the same ``(H, R, W)`` bias; the windows are strided
    views of keys padded with an ``-inf`` column, and ``q.k * scale - lse`` and ``dO.v - delta`` each
    come from one batched matmul of augmented operands per group of blocks."""
    batch, heads, q_len, dim = q.shape
    kv_heads, k_len, dim_v = k.shape[1], k.shape[2], v.shape[-1]
    groups = heads // kv_heads
    m = bias.max_distance
    reach = min(m, q_len + k_len)  # offsets beyond Nq + Nk never occur
    rows = min(BAND_ROWS, max(32, reach))  # query rows per band block, which reads rows + 2 reach - 2 keys
    width = rows + 2 * reach - 2
    blocks = -(-q_len // rows)
    offset = k_len - q_len
    d = torch.arange(width, device=q.device)[None, :] - torch.arange(rows, device=q.device)[:, None] - (reach - 1)
    with torch.no_grad():
        values = bias.offsets(-(rows - 1) - (reach - 1), width - 1 - (reach - 1), q.dtype)  # (H, R+W-1)
        block_bias = values[:, d - d.min()]  # (H, R, W)
        if causal:
            block_bias = block_bias.masked_fill(d > 0, float("-inf"))
    # operands with one or two columns more, each filled by one copy: q.k*scale - lse (and the
    # key's -inf column: padding and key_mask) and dO.v - delta come from one matmul each
    first = offset - (reach - 1)  # the first key of block 0
    left = max(0, -first)
    right = max(0, (blocks - 1) * rows + first + width - k_len)
    qa = q.new_zeros(batch, heads, blocks * rows, dim + 2)  # (B, H, blocks*R, D+2)
    torch.mul(q, scale, out=qa[:, :, :q_len, :dim])
    qa[:, :, :q_len, dim] = -lse
    qa[..., dim + 1] = 1.0  # padding rows too (0 * -inf would be nan); their dO is zero
    ga = q.new_zeros(batch, heads, blocks * rows, dim_v + 1)  # (B, H, blocks*R, Dv+1)
    ga[:, :, :q_len, :dim_v] = grad
    ga[:, :, :q_len, dim_v] = -delta
    ka = q.new_zeros(batch, kv_heads, left + k_len + right, dim + 2)  # (B, H_kv, L+Nk+R, D+2)
    ka[:, :, left : left + k_len, :dim] = k
    ka[..., dim] = 1.0
    ka[:, :, :left, dim + 1] = float("-inf")
    ka[:, :, left + k_len :, dim + 1] = float("-inf")
    if key_mask is not None:
        ka[:, :, left : left + k_len, dim + 1] = _padding(key_mask, q.dtype)[:, :, 0]  # (B, 1, Nk)
    va = q.new_zeros(batch, kv_heads, left + k_len + right, dim_v + 1)  # (B, H_kv, L+Nk+R, Dv+1)
    va[:, :, left : left + k_len, :dim_v] = v
    va[..., dim_v] = 1.0

    def windows(x: Tensor) -> Tensor:  # (B, H_kv, blocks, W, E): block b from key b*R + first
        e = x.shape[-1]
        return x.as_strided((batch, kv_heads, blocks, width, e),
                            (x.stride(0), x.stride(1), rows * e, e, 1),
                            x.storage_offset() + (first + left) * e)

    kw, vw = windows(ka), windows(va)
    qb = qa.view(batch, kv_heads, groups, blocks, rows, dim + 2)
    gb = ga.view(batch, kv_heads, groups, blocks, rows, dim_v + 1)
    step = max(1, BAND_ELEMENTS // max(batch * heads * rows * width, 1))
    total = q.new_zeros(heads, rows, width)  # (H, R, W)
    for b0 in range(0, blocks, step):
        b1 = min(b0 + step, blocks)
        s = torch.matmul(qb[:, :, :, b0:b1], kw[:, :, None, b0:b1].transpose(-1, -2))  # (B, Hk, G, n, R, W)
        p = s.view(batch, heads, b1 - b0, rows, width).add_(block_bias[None, :, None]).exp_()
        dp = torch.matmul(gb[:, :, :, b0:b1], vw[:, :, None, b0:b1].transpose(-1, -2))
        total += p.mul_(dp.view(batch, heads, b1 - b0, rows, width)).sum((0, 2))
    # diagonal sums: row r shifted left by r (column w - r + R - 1), then column sums
    shifted = q.new_zeros(heads, rows, width + rows - 1)
    shifted.as_strided((heads, rows, width), (rows * (width + rows - 1), width + rows - 2, 1),
                       rows - 1).copy_(total)
    sums = shifted.sum(1)  # (H, W+R-1): column c is the offset d = c - (R-1) - (reach-1)
    out = q.new_zeros(heads, 2 * m - 1)
    out[:, m - reach : m + reach - 1] = sums[:, rows - 1 : rows - 1 + 2 * reach - 1]
    return out


def _tail(q: Tensor, k: Tensor, v: Tensor, grad: Tensor, lse: Tensor, delta: Tensor,
          key_mask: Tensor | None, edge: Tensor, scale: float) -> Tensor:
    """Per head, the sum of ``dS`` over a tail of constant bias ``edge (H,)``, by top-left causal attention:
    per row ``exp(lse_t + edge - lse) * (dO . o_t - delta)``."""
    heads, rows = q.shape[1], q.shape[2]
    mask = None
    if key_mask is not None:
        pad = _padding(key_mask, q.dtype)  # (B, 1, 1, Nk)
        mask = pad.expand(-1, heads, rows, -1)  # (B, H, rows, Nk)
    o_t, lse_t = CPU_FLASH(q.contiguous(), k, v, 0.0, True, attn_mask=mask, scale=scale)  # (B, H, n, Dv), (B, H, n)
    weight = (lse_t + edge.view(1, heads, 1) - lse).exp_()  # (B, H, n)
    per_row = weight * ((grad * o_t).sum(-1) - delta)  # (B, H, n)
    if key_mask is not None:  # rows whose tail keys are all padding (flash gave zeros): none
        reach = torch.arange(rows, device=q.device)  # row r reads j <= r
        first = torch.where(key_mask.any(-1), key_mask.int().argmax(-1), key_mask.shape[-1])  # (B,) first real key
        empty = reach[None, :] < first[:, None]  # (B, n)
        per_row = per_row.masked_fill(empty[:, None, :], 0.0)
    return per_row.sum((0, 2))


def _table_grad(grad: Tensor, q: Tensor, out: Tensor, lse: Tensor, k: Tensor, v: Tensor,
                key_mask: Tensor | None, causal: bool, bias: RelativeBias, scale: float) -> Tensor:
    """The learned table's gradient ``(H, 2M + 1)``: sums of ``dS = P * (dP - delta)`` on the band's diagonals,
    one tail by attention (:func:`_tail`) and the other from ``dS``'s zero row sums."""
    m = bias.max_distance
    heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    table = q.new_zeros(heads, 2 * m + 1)  # (H, 2M+1)
    if m == 0:  # one entry for every pair: the sum of each row of dS, zero
        return table
    delta = (grad * out).sum(-1)  # (B, H, Nq)
    band = _band_grad(grad, q, k, v, lse, delta, key_mask, bias, causal, scale)  # (H, 2M-1)
    offset = k_len - q_len
    lower = q.new_zeros(heads)
    upper = q.new_zeros(heads)
    if causal:
        lower = -band.sum(1)
    elif offset <= m:  # lower tail d <= -M: rows i >= M - offset read j <= i + offset - M
        start = m - offset
        if start < q_len:
            edge = bias.offsets(-m, -m, q.dtype).detach()[:, 0]  # (H,)
            lower = _tail(q[:, :, start:], k, v, grad[:, :, start:], lse[:, :, start:],
                          delta[:, :, start:], key_mask, edge, scale)
        upper = -(band.sum(1) + lower)
    else:  # upper tail d >= M, queries and keys reversed: rows r' >= M read j' <= r' - M
        edge = bias.offsets(m, m, q.dtype).detach()[:, 0]  # (H,)
        if q_len > m:
            upper = _tail(q.flip(2)[:, :, m:], k.flip(2), v.flip(2), grad.flip(2)[:, :, m:],
                          lse.flip(2)[:, :, m:], delta.flip(2)[:, :, m:],
                          None if key_mask is None else key_mask.flip(-1), edge, scale)
        lower = -(band.sum(1) + upper)
    table[:, 1 : 2 * m] = band
    table[:, 0] = lower
    table[:, 2 * m] = upper
    return table


class _RelativeAttention(torch.autograd.Function):
    """Attention with a relative bias, passing gradients of q, k, v and a learned table."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, values: Tensor, bias: RelativeBias,
                key_mask: Tensor | None, causal: bool, scale: float) -> Tensor:
        batch, heads, q_len, _ = q.shape
        k_len = k.shape[2]
        plan = _Plan.of(batch, heads, q_len, k_len, causal, key_mask is not None, q.device)
        vec = _offset_vector(bias, q_len, k_len, causal, q.dtype)  # (H, Nq + Nk - 1)
        pad = _padding(key_mask, q.dtype)  # (B, 1, 1, Nk) | None
        qf = q.flip(2)  # (B, H, Nq, D) rows reversed
        of, lse = _forward(qf, k, v, vec, pad, plan, scale)  # (B, H, Nq, Dv), (B, H, Nq)
        out = of.flip(2)  # (B, H, Nq, Dv)
        ctx.save_for_backward(q, qf, k, v, of, lse, out)
        ctx.extra = (bias, key_mask, pad, vec, plan, scale)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, qf, k, v, of, lse, out = ctx.saved_tensors
        bias, key_mask, pad, vec, plan, scale = ctx.extra
        grad = grad.contiguous()
        gf = grad.flip(2)  # (B, H, Nq, Dv) rows reversed
        dqf, dk, dv = _flash_backward(gf, qf, k, v, of, lse, vec, pad, plan, scale)
        dtable = None
        if ctx.needs_input_grad[3]:
            dtable = _table_grad(grad, q, out, lse.flip(2), k, v, key_mask, plan.causal, bias, scale)
        return dqf.flip(2), dk, dv, dtable, None, None, None, None


@without_autocast
def relative_attention(q: Tensor, k: Tensor, v: Tensor, bias: RelativeBias, *, causal: bool = False,
                       key_mask: Tensor | None = None) -> Tensor:
    """Exact attention with the relative bias ``bias``: ``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, .)``
    -> ``(B, H, Nq, Dv)``, bottom-right aligned, O(N) memory. Half precision computes in float32."""
    dtype = q.dtype
    compute = upcast(dtype)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dim, dim_v = q.shape[-1], v.shape[-1]
    # the flash kernel takes one head size: zero columns leave q.k and the output's first
    # Dv columns as they are (the scale stays 1/sqrt(D))
    if dim_v < dim:
        v = F.pad(v, (0, dim - dim_v))  # (B, H_kv, Nk, D)
    elif dim < dim_v:
        q, k = F.pad(q, (0, dim_v - dim)), F.pad(k, (0, dim_v - dim))  # (B, ., N, Dv)
    out = _RelativeAttention.apply(q, k, v, bias.values, bias, key_mask, bool(causal), scale)
    return out[..., :dim_v].to(dtype)  # (B, H, Nq, Dv)


def _describe(bias: RelativeBias, plan: _Plan, key_mask: bool, grad: bool) -> str:
    """What one call runs, in words."""
    parts = [f"flash-cpu, {bias.kind} bias as a strided view of its offset vector"]
    if plan.causal:
        parts.append(f"causal: {len(plan.chunks)} query chunks over the keys they reach")
    if key_mask:
        parts.append(f"key padding added per chunk ({len(plan.chunks)} chunks)")
    if grad and bias.trainable:
        parts.append("table gradient: band blocks + tails by log-sum-exp")
    return "; ".join(parts)


class RelativeKernel(Kernel):
    """Full or causal attention with a relative position bias through torch's CPU flash kernel."""

    name = "relative"
    SUPPORTED_DEVICES = ("cpu",)
    computes_half_in_float32 = True
    description = "CPU flash attention with a relative bias (learned, ALiBi) as a strided offset view, O(N)"

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        if CPU_FLASH is None or CPU_FLASH_BACKWARD is None:
            reasons.append(f"{self.name} needs torch's CPU flash kernel "
                           "(aten::_scaled_dot_product_flash_attention_for_cpu), absent in this torch")
        if pattern.relative_bias is None:
            reasons.append(f"{pattern.name} has no relative position bias (Pattern.relative_bias) "
                           f"for {self.name} to run")
        elif pattern.mask_mod is not None or pattern.band is not None or pattern.grid is not None:
            reasons.append(f"{self.name} runs full or causal attention with a relative bias; "
                           f"{pattern.name} also has a mask")
        if call is not None and call.k_len == 0:
            reasons.append(f"{self.name} needs at least one key (Nk = 0)")
        return reasons

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        bias = pattern.relative_bias
        assert bias is not None  # not_supported_reasons refuses patterns without one
        out = relative_attention(q, k, v, bias, causal=causal, key_mask=key_mask)  # (B, H, Nq, Dv)
        plan = _Plan.of(q.shape[0], q.shape[1], q.shape[2], k.shape[2], causal, key_mask is not None,
                        q.device)
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                            or bias.values.requires_grad)
        path = _describe(bias, plan, key_mask is not None, grad) + gqa_note(q.shape[1], k.shape[1], "native")
        return out, KernelPath(self.name, path, backend="flash-cpu")
