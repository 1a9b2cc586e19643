"""The ``blocked`` kernel: banded attention in O(N*w) time and O(N) extra memory, any device.

Queries are cut into blocks of ``S`` rows; block ``t`` attends to the ``nw`` key blocks
around it (``nl`` to the left, ``nr`` to the right, ``L = nw * S`` keys), read as a strided
*view* of the zero-padded keys (``unfold``, no copy). Band edges are one additive
``(S, L)`` mask shared by every block; padding and ``key_mask`` are one additive bias per key.
Blocks are processed in chunks (a few MB of scores each, so the softmax stays in cache) and
the backward pass recomputes scores from the saved log-sum-exp (as flash attention does):
no ``N x N`` and no ``N x L`` tensor is ever stored, forward or backward.

Patterns (:class:`attn.Band`):

* sliding window ``|i - j| <= w``: the band itself;
* dilated ``(i - j) % r == 0 and |i - j| <= r*w``: positions are regrouped by residue mod
  ``r`` (a free reshape after padding), which turns the pattern into a plain window ``w`` on
  each of the ``r`` subsequences, folded into the head dimension;
* global tokens ``i < g or j < g or band``: rows ``i < g`` are dense (O(g*N)); the other rows
  combine the band (keys ``j < g`` removed from it) with ``g`` dense global columns through
  their log-sum-exps, which is the same softmax over the union.

A position bias (score_mod) is evaluated on the band only (``(B|1, H, nb, S, L)``, O(N*w))
and receives gradients. Rows with no allowed key give zeros, forward and backward.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.base import Attention, Band, KernelPath
from attn.kernels.base import Kernel
from attn.mods import ScoreMod

#: target size of one chunk of scores (elements); keeps the softmax passes in cache
CHUNK_ELEMENTS = 1 << 21
#: cap on the number of chunks: every op is an OpenMP region, and on a shared CPU a region
#: waits for its slowest thread, so fewer, larger ops are faster (memory stays O(N*w / 16))
MAX_CHUNKS = 16


def block_size(window: int) -> int:
    """Query block size for a window: about ``w/2`` (so ``L = S + 2w`` wastes ~25%), 16..64."""
    return max(16, min(64, window // 2 if window >= 32 else window))


def _span(x: Tensor, start: int, length: int) -> Tensor:
    """Rows ``[start, start + length)`` of ``x (..., N, D)`` along dim -2, zero outside ``[0, N)``."""
    n = x.shape[-2]
    lo, hi = max(start, 0), min(start + length, n)
    if hi <= lo:
        return x.new_zeros(*x.shape[:-2], length, x.shape[-1])
    return F.pad(x[..., lo:hi, :], (0, 0, lo - start, start + length - hi))


def band_edges(s: int, nl: int, nr: int, window: int, causal: bool, dtype: torch.dtype,
               device: torch.device) -> Tensor:
    """Additive mask ``(S, L)``: 0 where ``|i - j| <= w`` (and ``j <= i`` if causal), else -inf.

    Query row ``a`` of a block and window column ``c`` are ``i - j = a - c + nl*S`` apart.
    """
    a = torch.arange(s, device=device).view(s, 1)
    c = torch.arange((nl + 1 + nr) * s, device=device).view(1, -1)
    diff = a - c + nl * s  # (S, L) = i - j
    ok = diff.abs() <= window
    if causal:
        ok &= diff >= 0
    return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill_(~ok, float("-inf"))


def _chunks(nb: int, per_block: int) -> list[tuple[int, int]]:
    """Block ranges of about ``CHUNK_ELEMENTS`` scores, at most ``MAX_CHUNKS`` of them."""
    step = max(1, CHUNK_ELEMENTS // max(per_block, 1), math.ceil(nb / MAX_CHUNKS))
    return [(t, min(t + step, nb)) for t in range(0, nb, step)]


def _bmm_into(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """``out (c, BH, m, n) (+)= a (c, BH, m, k) @ b (c, BH, k, n)`` with no copies."""
    o3 = out.view(-1, *out.shape[-2:])
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    if accumulate:
        o3.baddbmm_(a3, b3)
    else:
        torch.bmm(a3, b3, out=o3)


class _BandCore(torch.autograd.Function):
    """Softmax attention of query blocks over their ``nw`` neighbouring key blocks.

    Blocks-major layout, so that key block ``t + u`` of every query block ``t`` in a chunk is
    one contiguous slice and every product is a plain ``bmm`` (no window copies): ``qb (nb,
    BH, S, D)`` (already scaled by 1/sqrt(D)); ``kg, vg (nb+nw-1, BH, S, D|Dv)`` the padded
    keys/values as blocks; ``key_bias (nb+nw-1, BH|1, S)`` additive (0 / -inf) or None, with
    ``bias_blocks (nb+nw-1,)`` True where a block holds a -inf; ``edges (nw, S, S)`` the band
    edges per window slab, applied on slabs ``edge_slabs``; ``score_bias (nw, nb, BH|1, S,
    S)`` or None. Scores of a chunk are slabs ``(nw, c, BH, S, S)``; the softmax runs over
    (slab, column). Returns ``out (nb, BH, S, Dv)`` and ``lse (nb, BH, S)``, -inf (and out 0)
    on rows with no allowed key.
    """

    @staticmethod
    def _scores(qb, kg, key_bias, bias_blocks, edges, edge_slabs, score_bias, nw, t0, t1):
        c, bh, s, _ = qb[t0:t1].shape
        sc = qb.new_empty(nw, c, bh, s, s)  # (nw, c, BH, S, S)
        q = qb[t0:t1]
        for u in range(nw):
            _bmm_into(sc[u], q, kg[t0 + u : t1 + u].transpose(-1, -2), accumulate=False)
        for u in edge_slabs:
            sc[u].add_(edges[u])
        if key_bias is not None and bool(bias_blocks[t0 : t1 + nw - 1].any()):
            for u in range(nw):
                sc[u].add_(key_bias[t0 + u : t1 + u].unsqueeze(-2))  # (c, BH|1, 1, S)
        if score_bias is not None:
            sc.add_(score_bias[:, t0:t1])
        return sc

    @staticmethod
    def forward(ctx: Any, qb, kg, vg, key_bias, bias_blocks, edges, score_bias, nw: int,
                edge_slabs: tuple[int, ...]):
        nb, bh, s, _ = qb.shape
        out = qb.new_empty(nb, bh, s, vg.shape[-1])  # (nb, BH, S, Dv)
        lse = qb.new_empty(nb, bh, s)
        tiny = torch.finfo(qb.dtype).tiny
        for t0, t1 in _chunks(nb, bh * s * nw * s):
            p = _BandCore._scores(qb, kg, key_bias, bias_blocks, edges, edge_slabs, score_bias,
                                  nw, t0, t1)
            m = p.amax(dim=(0, -1))  # (c, BH, S)
            m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
            p.sub_(m.unsqueeze(-1)).exp_()
            den = p.sum(dim=(0, -1))  # (c, BH, S)
            o = out[t0:t1]
            for u in range(nw):
                _bmm_into(o, p[u], vg[t0 + u : t1 + u], accumulate=u > 0)
            o.div_(den.clamp_min(tiny).unsqueeze(-1))
            torch.add(m, den.log(), out=lse[t0:t1])  # -inf where no key
        ctx.save_for_backward(qb, kg, vg, key_bias, bias_blocks, edges, score_bias, out, lse)
        ctx.nw, ctx.edge_slabs = nw, edge_slabs
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out, d_lse):
        qb, kg, vg, key_bias, bias_blocks, edges, score_bias, out, lse = ctx.saved_tensors
        nw, edge_slabs = ctx.nw, ctx.edge_slabs
        nb, bh, s, _ = qb.shape
        if d_out is None:
            d_out = torch.zeros_like(out)
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(dim=-1)  # (nb, BH, S)
        if d_lse is not None:
            delta = delta - d_lse
        lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
        dq = torch.empty_like(qb)
        dkg = torch.zeros_like(kg)
        dvg = torch.zeros_like(vg)
        d_bias = None
        if score_bias is not None and ctx.needs_input_grad[6]:
            d_bias = qb.new_empty(nw, nb, bh, s, s)
        for t0, t1 in _chunks(nb, bh * s * nw * s):
            p = _BandCore._scores(qb, kg, key_bias, bias_blocks, edges, edge_slabs, score_bias,
                                  nw, t0, t1)
            p.sub_(lse_safe[t0:t1].unsqueeze(-1)).exp_()  # probabilities (nw, c, BH, S, S)
            do = d_out[t0:t1]  # (c, BH, S, Dv)
            ds = torch.empty_like(p)
            for u in range(nw):
                _bmm_into(dvg[t0 + u : t1 + u], p[u].transpose(-1, -2), do, accumulate=True)
                _bmm_into(ds[u], do, vg[t0 + u : t1 + u].transpose(-1, -2), accumulate=False)
            ds.sub_(delta[t0:t1].unsqueeze(-1)).mul_(p)  # dS = P * (dP - delta)
            if d_bias is not None:
                d_bias[:, t0:t1] = ds
            q = qb[t0:t1]
            for u in range(nw):
                _bmm_into(dq[t0:t1], ds[u], kg[t0 + u : t1 + u], accumulate=u > 0)
                _bmm_into(dkg[t0 + u : t1 + u], ds[u].transpose(-1, -2), q, accumulate=True)
        if d_bias is not None and d_bias.shape != score_bias.shape:
            d_bias = d_bias.sum_to_size(score_bias.shape)
        return dq, dkg, dvg, None, None, None, d_bias, None, None


def _edge_slabs(s: int, nl: int, nr: int, window: int, causal: bool) -> tuple[int, ...]:
    """Window slabs (key blocks ``u``) where the band edge masks something."""
    slabs = []
    for u in range(nl + 1 + nr):
        d = nl - u  # block distance: i - j = a - c' + d*S, a, c' in [0, S)
        lo, hi = d * s - (s - 1), d * s + (s - 1)
        if hi > window or lo < -window or (causal and lo < 0):
            slabs.append(u)
    return tuple(slabs)



def band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    q_offset: int,
    key_valid: Tensor | None,
    bias_fn: Any = None,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention of ``q (B, H, Nq, D)`` at positions ``q_offset + row`` over ``k, v (B, H, Nk, .)``
    at positions ``0..Nk-1``, allowed ``|i - j| <= window`` (``j <= i`` if causal).

    ``key_valid (B|1, H|1, Nk)`` bool removes keys. ``bias_fn(i (nb, S, 1), j (nb, 1, L))``
    returns an additive score bias ``(B|1, H|1, nb, S, L)`` for positions in this coordinate
    system. Returns ``out (B, H, Nq, Dv)`` and ``lse (B, H, Nq)`` (-inf on rows with no key).
    """
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    s = block or block_size(window)
    nl = math.ceil(window / s)
    nr = 0 if causal else nl
    nw = nl + 1 + nr
    nb = math.ceil(q_len / s)
    a0 = q_offset - nl * s  # absolute position of the first padded key
    g_len = (nb + nw - 1) * s
    bh = batch * heads

    def blocks(x: Tensor, start: int, length: int) -> Tensor:  # (B, H, N, D) -> (n, BH, S, D)
        x = _span(x, start, length).reshape(bh, length // s, s, x.shape[-1])
        return x.transpose(0, 1).contiguous()

    qb = blocks(q * (1.0 / math.sqrt(dim)), 0, nb * s)  # (nb, BH, S, D), pre-scaled
    kg = blocks(k, a0, g_len)  # (nb+nw-1, BH, S, D)
    vg = blocks(v, a0, g_len)
    pos = torch.arange(a0, a0 + g_len, device=q.device)  # key positions of the padded span
    valid = ((pos >= 0) & (pos < k_len)).view(1, 1, g_len)
    key_bias = bias_blocks = None
    if a0 < 0 or a0 + g_len > k_len or key_valid is not None:
        if key_valid is not None:
            kv = _span(key_valid.unsqueeze(-1).to(q.dtype), a0, g_len).squeeze(-1) > 0
            valid = valid & kv  # (B|1, H|1, g_len)
        if valid.shape[0] * valid.shape[1] > 1:
            valid = valid.expand(batch, heads, g_len)
        valid = valid.reshape(-1, nb + nw - 1, s).transpose(0, 1)  # (nb+nw-1, BH|1, S)
        key_bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device)
        key_bias = key_bias.masked_fill_(~valid, float("-inf")).contiguous()
        bias_blocks = (~valid).flatten(1).any(dim=1)  # (nb+nw-1,)
    edges = band_edges(s, nl, nr, window, causal, q.dtype, q.device)
    score_bias = None
    if bias_fn is not None:
        i = (q_offset + torch.arange(nb * s, device=q.device)).view(nb, s, 1)
        j = (a0 + torch.arange(nb, device=q.device) * s).view(nb, 1, 1) + torch.arange(
            nw * s, device=q.device
        ).view(1, 1, nw * s)
        sb = bias_fn(i, j).to(q.dtype)  # (B|1, H|1, nb, S, L)
        if sb.shape[0] * sb.shape[1] > 1:
            sb = sb.expand(batch, heads, *sb.shape[2:])
        sb = sb.flatten(0, 1).unflatten(-1, (nw, s))  # (BH|1, nb, S, nw, S)
        score_bias = sb.permute(3, 1, 0, 2, 4).contiguous()  # (nw, nb, BH|1, S, S)
    edges = edges.view(s, nw, s).transpose(0, 1).contiguous()  # (nw, S, S)
    slabs = _edge_slabs(s, nl, nr, window, causal)
    out, lse = _BandCore.apply(qb, kg, vg, key_bias, bias_blocks, edges, score_bias, nw, slabs)
    out = out.transpose(0, 1).reshape(batch, heads, nb * s, -1)[:, :, :q_len]  # (B, H, Nq, Dv)
    lse = lse.transpose(0, 1).reshape(batch, heads, nb * s)[:, :, :q_len]  # (B, H, Nq)
    return out, lse


def _bias_fn(score_mod: ScoreMod | None, batch: int, heads: int, dilation: int, device):
    """Score bias on band positions, mapped back from residue subsequences (``h' = h*r + c``)."""
    if score_mod is None:
        return None

    def fn(i_sub: Tensor, j_sub: Tensor) -> Tensor:
        r = dilation
        b = torch.arange(batch, device=device).view(batch, 1, 1, 1, 1, 1)
        h = torch.arange(heads, device=device).view(1, heads, 1, 1, 1, 1)
        c = torch.arange(r, device=device).view(1, 1, r, 1, 1, 1)
        i = c + r * i_sub.view(1, 1, 1, *i_sub.shape)
        j = c + r * j_sub.view(1, 1, 1, *j_sub.shape)
        zero = torch.zeros((), device=device)
        bias = score_mod(zero, b, h, i, j)  # (B|1, H|1, r|1, nb, S, L)
        shape = torch.broadcast_shapes(bias.shape, (1, heads, r, 1, 1, 1))
        bias = bias.expand(bias.shape[0], *shape[1:])
        return bias.flatten(1, 2)  # (B|1, H*r, nb, S, L)

    return fn


def _fold(x: Tensor, r: int) -> Tensor:
    """``(B, H, M*r, D)`` -> ``(B, H*r, M, D)``: row ``m*r + c`` goes to head ``h*r + c``, row m."""
    batch, heads, n, dim = x.shape
    return x.view(batch, heads, n // r, r, dim).transpose(2, 3).reshape(batch, heads * r, n // r, dim)


def _unfold_heads(x: Tensor, r: int) -> Tensor:
    """Inverse of :func:`_fold` for ``(B, H*r, M, D)`` -> ``(B, H, M*r, D)``."""
    batch, hr, m, dim = x.shape
    return x.view(batch, hr // r, r, m, dim).transpose(2, 3).reshape(batch, hr // r, m * r, dim)


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Band,
    *,
    causal: bool,
    key_mask: Tensor | None,
    score_mod: ScoreMod | None = None,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact attention for a :class:`Band` pattern (no global part); returns ``(out, lse)``.

    ``key_mask (B, Nk)`` and, for global tokens, the exclusion of keys ``j < g`` from the band
    are applied here. Positions are bottom-right aligned.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    r, g = band.dilation, band.num_global
    offset = k_len - q_len
    valid = None  # (B|1, 1, Nk)
    if key_mask is not None or g > 0:
        valid = torch.ones(1, 1, k_len, dtype=torch.bool, device=q.device)
        if key_mask is not None:
            valid = valid & key_mask.view(batch, 1, k_len)
        if g > 0:
            valid = valid & (torch.arange(k_len, device=q.device) >= g)
    if r == 1:
        return band_attention(
            q, k, v, window=band.window, causal=causal, q_offset=offset, key_valid=valid,
            bias_fn=_bias_fn(score_mod, batch, heads, 1, q.device), block=block,
        )
    # regroup by residue: key j -> (c = j % r, j // r); query i likewise (front-padded so the
    # first query row's residue lines up with its absolute position)
    q_start = (offset // r) * r  # a multiple of r at or before the first query position
    q_front = offset - q_start
    mq = math.ceil((q_front + q_len) / r)
    mk = math.ceil(k_len / r)
    qf = _fold(_span(q, -q_front, mq * r), r)  # (B, H*r, mq, D)
    kf = _fold(_span(k, 0, mk * r), r)  # (B, H*r, mk, D)
    vf = _fold(_span(v, 0, mk * r), r)
    kvalid = torch.arange(mk * r, device=q.device) < k_len
    kvalid = kvalid.view(1, 1, mk * r)
    if valid is not None:
        pad = valid.new_zeros(*valid.shape[:-1], mk * r - k_len)
        kvalid = kvalid & torch.cat([valid, pad], dim=-1)
    kvalid = kvalid.view(kvalid.shape[0], 1, mk, r).transpose(-1, -2)  # (B|1, 1, r, mk)
    kvalid = kvalid.expand(kvalid.shape[0], heads, r, mk).reshape(kvalid.shape[0], heads * r, mk)
    out, lse = band_attention(
        qf, kf, vf, window=band.window, causal=causal, q_offset=q_start // r, key_valid=kvalid,
        bias_fn=_bias_fn(score_mod, batch, heads, r, q.device), block=block,
    )
    out = _unfold_heads(out, r)[:, :, q_front : q_front + q_len]  # (B, H, Nq, Dv)
    lse = _unfold_heads(lse.unsqueeze(-1), r)[:, :, q_front : q_front + q_len, 0]
    return out, lse


def _dense_part(
    q: Tensor, k: Tensor, v: Tensor, i: Tensor, j: Tensor, allowed: Tensor,
    score_mod: ScoreMod | None,
) -> tuple[Tensor, Tensor]:
    """Dense softmax of ``q (B, H, n, D)`` over ``k (B, H, m, D)`` at positions ``i (n,)``,
    ``j (m,)`` with ``allowed (B|1, 1, n, m)``; returns ``(out, lse)``.

    A row with no allowed key gets out 0 and lse -inf, with finite (zero) gradients.
    """
    batch, heads = q.shape[:2]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, n, m)
    if score_mod is not None:
        b = torch.arange(batch, device=q.device).view(batch, 1, 1, 1)
        h = torch.arange(heads, device=q.device).view(1, heads, 1, 1)
        scores = score_mod(scores, b, h, i.view(1, 1, -1, 1), j.view(1, 1, 1, -1))
    scores = scores.masked_fill(~allowed, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    den = p.sum(dim=-1, keepdim=True)
    safe = den.clamp_min(torch.finfo(den.dtype).tiny)
    out = torch.matmul(p, v) / safe  # empty rows: 0
    lse = torch.where(den > 0, m + safe.log(), torch.full_like(m, float("-inf")))
    return out, lse.squeeze(-1)


def _merge(o1: Tensor, l1: Tensor, o2: Tensor, l2: Tensor) -> Tensor:
    """Combine two softmax parts over disjoint key sets by their log-sum-exps ``(B, H, n)``."""
    m = torch.maximum(l1, l2).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp(l1 - m).unsqueeze(-1), torch.exp(l2 - m).unsqueeze(-1)
    den = (w1 + w2).clamp_min(torch.finfo(o1.dtype).tiny)
    return (o1 * w1 + o2 * w2) / den


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Band,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    score_mod: ScoreMod | None = None,
    block: int | None = None,
) -> Tensor:
    """Exact banded attention (sliding window, dilated, global tokens) in O(N*w) time.

    ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)`` -> ``(B, H, Nq, Dv)``.
    """
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    dtype = q.dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    batch, _, q_len, _ = q.shape
    k_len = k.shape[2]
    g = band.num_global
    offset = k_len - q_len
    n_glob_rows = min(max(g - offset, 0), q_len) if g > 0 else 0  # query rows with i < g
    if n_glob_rows == q_len:
        band_out = None
    else:
        qs = q[:, :, n_glob_rows:]
        out, lse = banded_attention(
            qs, k, v, band, causal=causal, key_mask=key_mask, score_mod=score_mod, block=block
        )
        if g > 0:  # dense global columns j < g for the non-global rows (all have i >= g > j)
            gk = min(g, k_len)
            i = torch.arange(offset + n_glob_rows, k_len, device=q.device)
            j = torch.arange(gk, device=q.device)
            allowed = torch.ones(1, 1, 1, gk, dtype=torch.bool, device=q.device)
            if key_mask is not None:
                allowed = allowed & key_mask[:, :gk].view(batch, 1, 1, gk)
            o2, l2 = _dense_part(qs, k[:, :, :gk], v[:, :, :gk], i, j, allowed, score_mod)
            out = _merge(out, lse, o2, l2)
        band_out = out
    if n_glob_rows == 0:
        result = band_out
    else:  # global rows: dense over every key (causal: j <= i)
        i = torch.arange(offset, offset + n_glob_rows, device=q.device)
        j = torch.arange(k_len, device=q.device)
        allowed = torch.ones(1, 1, n_glob_rows, k_len, dtype=torch.bool, device=q.device)
        if causal:
            allowed = allowed & (j.view(1, -1) <= i.view(-1, 1))
        if key_mask is not None:
            allowed = allowed & key_mask.view(batch, 1, 1, k_len)
        o_glob, _ = _dense_part(q[:, :, :n_glob_rows], k, v, i, j, allowed, score_mod)
        result = o_glob if band_out is None else torch.cat([o_glob, band_out], dim=2)
    return result.to(dtype)


class BlockedKernel(Kernel):
    """Banded blocks in pure PyTorch: O(N*w) time, O(N) extra memory, autograd, any device."""

    name = "blocked"
    description = "banded query/key blocks (sliding window, dilated, global tokens), O(N*w)"

    def supports(self, attention, device, dtype, causal, requires_grad) -> list[str]:
        if reasons := self.exactness_reasons(attention):
            return reasons
        if attention.band() is None:
            return [f"{attention.name} has no banded structure (band() is None)"]
        return []

    def run(self, attention: Attention, q, k, v, causal, key_mask):
        band = attention.band()
        score_mod = attention.score_mod()
        q_len, k_len = q.shape[2], k.shape[2]
        n_neg = max(q_len - k_len, 0)  # rows at negative absolute positions (Nq > Nk)
        fallback = None
        out = blocked_attention(
            q[:, :, n_neg:], k, v, band, causal=causal, key_mask=key_mask, score_mod=score_mod
        )
        if n_neg:
            # a variant's rule at negative positions is its own (e.g. global_tokens: i < g
            # holds for every i < 0); compute those rows exactly from the mask_mod
            from attn.kernels.chunked import chunked_attention

            head = chunked_attention(
                q[:, :, :n_neg], k, v, mask_mod=attention.mask_mod(), score_mod=score_mod,
                score_params=tuple(attention.parameters()), causal=causal, key_mask=key_mask,
                q_offset=k_len - q_len,
            )
            out = torch.cat([head, out], dim=2)
            fallback = f"{n_neg} query rows at negative positions (Nq > Nk) computed by chunked"
        parts = [f"w={band.window}"]
        if band.dilation > 1:
            parts.append(f"residues r={band.dilation}")
        if band.num_global:
            parts.append(f"g={band.num_global} dense rows/cols")
        path = f"banded blocks ({', '.join(parts)})"
        return out, KernelPath(self.name, path, fallback=fallback)
