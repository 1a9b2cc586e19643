"""The ``relative`` kernel: a relative position bias (learned table, ALiBi) at the speed of
fused attention on CPU, in O(N) memory.

The bias ``b_h(j - i)`` is Toeplitz, so with the query rows taken in reverse order it is a
*Hankel* block: ``bias[h, r', j] = vec[h, r' + j]`` for a 1-D per-head vector ``vec`` of the
``Nq + Nk - 1`` offsets. That block is a strided view of ``vec`` (strides ``(L, 1, 1)``),
never a materialised ``Nq x Nk`` tensor, and torch's CPU flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu``, the one SDPA runs) takes it as its
additive ``attn_mask``, returning the log-sum-exp too. Causal calls mask the offsets
``j - i > 0`` in the same vector (``-inf``), and run query chunks over the keys they can
reach only (about half the work); a ``key_mask`` is added per query chunk (that chunk's
mask is then materialised, ``(B, H, C, Nk)``).

Backward (:class:`_RelativeAttention`): the flash kernel's own backward gives ``dq, dk,
dv`` with the same mask view. A learned table also needs ``d table[h, M + d] = sum over
pairs on diagonal d of dS``, ``dS = P * (dP - delta)``; the table is clipped at ``M``, so

* the diagonals ``|d| < M`` are summed from dense blocks of the band only (query chunks of
  ``BAND_ROWS`` rows against the ``C + 2M`` keys around them, anti-diagonal sums of a
  strided view): O(N * M) work;
* the upper tail ``d >= M`` has one constant bias, so its sum per row is
  ``exp(lse_up - lse) * (dO . o_up - delta)`` where ``o_up, lse_up`` is attention over
  the keys ``j >= i + M`` alone: with queries and keys reversed that is top-left
  ``is_causal`` attention of the rows ``>= M``, which the flash kernel runs at half cost;
* the lower tail ``d <= -M`` follows because every row of ``dS`` sums to zero (softmax).

Calls with nothing left for the tails (``M >= Nq + Nk``) are all band. ALiBi has no
gradient to pass on. References: Press et al. 2022 (ALiBi); Shaw et al. 2018 and Raffel et
al. 2020 (learned relative biases); Dao 2023 (the log-sum-exp recompute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import expand_kv, gqa_note
from attn.kernels.base import Kernel, KernelPath
from attn.kernels.chunked import chunk_rows
from attn.pattern import Pattern, RelativeBias
from attn.precision import without_autocast

#: torch's CPU flash kernel and its backward (None where this torch lacks them)
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
#: query rows per flash call of a causal call (each reads only the keys its rows reach)
CAUSAL_ROWS = 256
#: most query rows per dense band block of a learned table's gradient, and the elements
#: (B * H * rows * keys) a block aims at: a few MB, so a long call is a few hundred blocks
BAND_ROWS = 128
BAND_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class _Plan:
    """The geometry of one call, in the reversed query order ``r' = Nq - 1 - r``.

    Row ``r'`` sits at absolute position ``a = Nk - 1 - r'``; the pair ``(r', j)`` has offset
    ``d = j - a = r' + j - (Nk - 1)``, i.e. ``vec[r' + j]`` with ``vec[t] = b(t - Nk + 1)``.
    """

    q_len: int
    k_len: int
    causal: bool
    chunks: tuple[tuple[int, int, int], ...]  # (r0, r1, keys): rows [r0, r1) read keys [0, keys)

    @classmethod
    def of(cls, batch: int, heads: int, q_len: int, k_len: int, causal: bool, key_mask: bool,
           device: torch.device) -> _Plan:
        """Query chunks: one call for a full unmasked call; ``CAUSAL_ROWS`` rows over the keys
        they reach for causal; rows of a few MB of mask each with a ``key_mask``."""
        rows = q_len
        if causal:
            rows = CAUSAL_ROWS
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
    """``vec (H, Nq + Nk - 1)``: ``vec[:, t] = b(t - Nk + 1)``, ``-inf`` past the diagonal
    when causal. No gradient (the backward computes the table's)."""
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
    """The additive mask of rows ``[r0, r1)`` over keys ``[0, keys)``: a view of ``vec``, or
    ``(B, H, C, keys)`` with the key padding ``pad (B, 1, 1, Nk)`` added."""
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
        return _FLASH(qf, k, v, 0.0, False, attn_mask=_chunk_mask(vec, pad, 0, plan.q_len, plan.k_len),
                      scale=scale)
    out = qf.new_zeros((*qf.shape[:-1], v.shape[-1]))  # (B, H, Nq, Dv)
    lse = qf.new_zeros(qf.shape[:-1])  # (B, H, Nq)
    for r0, r1, keys in plan.chunks:
        o, s = _FLASH(qf[:, :, r0:r1].contiguous(), k[:, :, :keys], v[:, :, :keys], 0.0, False,
                      attn_mask=_chunk_mask(vec, pad, r0, r1, keys), scale=scale)
        out[:, :, r0:r1], lse[:, :, r0:r1] = o, s
    return out, lse


def _flash_backward(gf: Tensor, qf: Tensor, k: Tensor, v: Tensor, of: Tensor, lse: Tensor,
                    vec: Tensor, pad: Tensor | None, plan: _Plan, scale: float
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """``dq`` (reversed rows), ``dk``, ``dv`` from the flash kernel's backward, chunk by chunk."""
    if len(plan.chunks) == 1 and plan.chunks[0] == (0, plan.q_len, plan.k_len):
        mask = _chunk_mask(vec, pad, 0, plan.q_len, plan.k_len)
        return _FLASH_BWD(gf, qf, k, v, of, lse, 0.0, False, attn_mask=mask, scale=scale)
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(k), torch.zeros_like(v)
    for r0, r1, keys in plan.chunks:
        dqc, dkc, dvc = _FLASH_BWD(
            gf[:, :, r0:r1].contiguous(), qf[:, :, r0:r1].contiguous(), k[:, :, :keys], v[:, :, :keys],
            of[:, :, r0:r1].contiguous(), lse[:, :, r0:r1].contiguous(), 0.0, False,
            attn_mask=_chunk_mask(vec, pad, r0, r1, keys), scale=scale)
        dq[:, :, r0:r1] = dqc
        dk[:, :, :keys] += dkc
        dv[:, :, :keys] += dvc
    return dq, dk, dv


def _augment(x: Tensor, column: Tensor | float) -> Tensor:
    """``x (..., N, D)`` with one more column: ``(..., N, D + 1)``, so that one matmul of two
    augmented operands also adds a per-row or per-column term."""
    extra = torch.as_tensor(column, dtype=x.dtype, device=x.device)
    extra = extra.expand(*x.shape[:-1]) if extra.dim() == 0 else extra
    return torch.cat((x, extra[..., None]), dim=-1)


def _band_rows(batch: int, heads: int, m: int) -> int:
    """Query rows per band block (a block reads ``rows + 2m - 1`` keys): about
    ``BAND_ELEMENTS`` scores, at least 32 rows, at most ``BAND_ROWS``."""
    rows = 32
    while rows < BAND_ROWS and batch * heads * 2 * rows * (2 * rows + 2 * m) <= BAND_ELEMENTS:
        rows *= 2
    return min(rows, BAND_ROWS)


def _band_grad(gf: Tensor, qf: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor,
               vec: Tensor, pad: Tensor | None, plan: _Plan, m: int, scale: float) -> Tensor:
    """Sums of ``dS`` on the diagonals ``|d| < m``: ``(H, 2m - 1)`` indexed by ``d + m - 1``.

    Per block of rows, against the keys of their band: ``P = exp(q.k * scale + bias - lse)``
    and ``dP - delta`` each from one matmul of augmented operands, their product written
    into a buffer where row ``r`` is shifted right by ``r``, whose column sums are the
    anti-diagonal sums of ``dS`` (one offset ``d`` each, rows being reversed)."""
    heads, q_len, k_len = qf.shape[1], plan.q_len, plan.k_len
    out = qf.new_zeros(heads, 2 * m - 1)  # (H, 2m-1)
    qa = _augment(qf * scale, -lse)  # (B, H, Nq, D+1): q.k*scale - lse in one matmul
    ga = _augment(gf, -delta)  # (B, H, Nq, Dv+1): dO.v - delta in one matmul
    ka, va = _augment(k, 1.0), _augment(v, 1.0)  # (B, H_kv, Nk, .+1)
    buffers: dict[tuple[int, int], Tensor] = {}
    step = _band_rows(qf.shape[0], heads, m)
    for r0 in range(0, q_len, step):
        r1 = min(r0 + step, q_len)
        # rows r' in [r0, r1) sit at a = Nk - 1 - r'; their band keys are a - m < j < a + m
        lo = max(0, k_len - r1 - m + 1)
        hi = min(k_len, k_len - 1 - r0 + m)
        if plan.causal:
            hi = min(hi, k_len - r0)
        if lo >= hi:
            continue
        rows, cols = r1 - r0, hi - lo
        s = torch.matmul(qa[:, :, r0:r1], expand_kv(ka[:, :, lo:hi], heads).transpose(-1, -2))  # (B, H, C, W)
        s.add_(_hankel(vec, r0 + lo, rows, cols))
        if pad is not None:
            s.add_(pad[..., lo:hi])
        p = s.exp_()  # (B, H, C, W)
        dp = torch.matmul(ga[:, :, r0:r1], expand_kv(va[:, :, lo:hi], heads).transpose(-1, -2))  # (B, H, C, W)
        if (rows, cols) not in buffers:  # zeros outside the shifted rows, reused
            buffers[(rows, cols)] = qf.new_zeros(heads, rows, cols + rows)
        shifted = buffers[(rows, cols)]
        view = shifted.as_strided((heads, rows, cols), (rows * (cols + rows), cols + rows + 1, 1))
        if p.shape[0] == 1:
            torch.mul(p[0], dp[0], out=view)  # (H, C, W), row r shifted right by r
        else:
            view.copy_(p.mul_(dp).sum(0))
        sums = shifted.sum(1)[:, : rows + cols - 1]  # (H, C + W - 1): t = r' - r0 + j - lo
        first = r0 + lo - (k_len - 1)  # the offset d at t = 0
        a, b = max(first, -m + 1), min(first + rows + cols - 2, m - 1)
        if a <= b:
            out[:, a + m - 1 : b + m] += sums[:, a - first : b - first + 1]
    return out


def _upper_tail(gf: Tensor, qf: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor,
                key_mask: Tensor | None, pad: Tensor | None, m: int, edge: Tensor, scale: float
                ) -> Tensor:
    """Per head, the sum of ``dS`` over the pairs ``d = j - a >= m``, where the bias is the
    constant ``edge (H,)``: ``(H,)``. Attention over those keys alone is top-left causal
    attention of the reversed rows ``r' >= m`` (row ``r = r' - m`` reads ``j' <= r``) over
    the reversed keys ``j' = Nk - 1 - j``; its sum of ``dS`` per row is
    ``exp(lse_up + edge - lse) * (dO . o_up - delta)``."""
    heads, q_len = qf.shape[1], qf.shape[2]
    if q_len <= m:
        return qf.new_zeros(heads)
    rows = q_len - m
    mask = None if pad is None else pad.flip(-1).expand(-1, heads, rows, -1)  # (B, H, rows, Nk)
    o_up, lse_up = _FLASH(qf[:, :, m:].contiguous(), k.flip(2), v.flip(2), 0.0, True,
                          attn_mask=mask, scale=scale)  # (B, H, rows, Dv), (B, H, rows)
    weight = (lse_up + edge.view(1, heads, 1) - lse[:, :, m:]).exp_()  # (B, H, rows)
    per_row = weight * ((gf[:, :, m:] * o_up).sum(-1) - delta[:, :, m:])  # (B, H, rows)
    if key_mask is not None:  # rows whose tail keys are all padding: no tail (flash gave zeros)
        first = torch.where(key_mask.flip(-1).any(-1), key_mask.flip(-1).int().argmax(-1),
                            key_mask.shape[-1])  # (B,) first real key in reversed order
        reach = torch.arange(rows, device=qf.device)  # row r reads j' <= r
        per_row = per_row.masked_fill((reach[None, :] < first[:, None])[:, None, :], 0.0)
    return per_row.sum((0, 2))


def _table_grad(gf: Tensor, qf: Tensor, k: Tensor, v: Tensor, of: Tensor, lse: Tensor,
                vec: Tensor, key_mask: Tensor | None, pad: Tensor | None, plan: _Plan,
                bias: RelativeBias, scale: float) -> Tensor:
    """The learned table's gradient ``(H, 2M + 1)``: band diagonals, the upper tail, and the
    lower tail from the rows of ``dS`` summing to zero."""
    m = bias.max_distance
    heads = qf.shape[1]
    grad = qf.new_zeros(heads, 2 * m + 1)  # (H, 2M+1)
    if m == 0:  # one entry for every pair: the sum of each row of dS, zero
        return grad
    delta = (gf * of).sum(-1)  # (B, H, Nq)
    band = _band_grad(gf, qf, k, v, lse, delta, vec, pad, plan, m, scale)  # (H, 2M-1)
    upper = qf.new_zeros(heads)
    if not plan.causal:
        edge = bias.offsets(m, m, qf.dtype).detach()[:, 0]  # (H,)
        upper = _upper_tail(gf, qf, k, v, lse, delta, key_mask, pad, m, edge, scale)
    grad[:, 1 : 2 * m] = band
    grad[:, 2 * m] = upper
    grad[:, 0] = -(band.sum(1) + upper)
    return grad


class _RelativeAttention(torch.autograd.Function):
    """Attention with a relative bias; its backward passes the gradients of q, k, v and of a
    learned table (see the module docstring)."""

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
        ctx.save_for_backward(qf, k, v, of, lse)
        ctx.extra = (bias, key_mask, pad, vec, plan, scale)
        return of.flip(2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        qf, k, v, of, lse = ctx.saved_tensors
        bias, key_mask, pad, vec, plan, scale = ctx.extra
        gf = grad.flip(2)  # (B, H, Nq, Dv) rows reversed
        dqf, dk, dv = _flash_backward(gf, qf, k, v, of, lse, vec, pad, plan, scale)
        dtable = None
        if ctx.needs_input_grad[3]:
            dtable = _table_grad(gf, qf, k, v, of, lse, vec, key_mask, pad, plan, bias, scale)
        return dqf.flip(2), dk, dv, dtable, None, None, None, None


@without_autocast
def relative_attention(q: Tensor, k: Tensor, v: Tensor, bias: RelativeBias, *, causal: bool = False,
                       key_mask: Tensor | None = None) -> Tensor:
    """Exact attention with the relative bias ``bias``: ``q (B, H, Nq, D)``, ``k, v (B, H_kv,
    Nk, .)`` -> ``(B, H, Nq, Dv)``, bottom-right aligned, O(N) memory beyond the inputs (a
    ``key_mask`` adds one query chunk's mask). Half precision is computed in float32; a
    value head size other than the query's is padded with zeros to the larger one."""
    dtype = q.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
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
    """Full or causal attention with a relative position bias through torch's CPU flash kernel,
    the bias a strided view of a per-head offset vector: O(N) memory, fused speed."""

    name = "relative"
    SUPPORTED_DEVICES = ("cpu",)
    computes_half_in_float32 = True
    description = "CPU flash attention with a relative bias (learned, ALiBi) as a strided offset view, O(N)"

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        if _FLASH is None or _FLASH_BWD is None:
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
