"""The ``blocked`` kernel: banded attention in O(N*w) time and memory, any device, autograd.

Queries are cut into blocks of ``S`` rows; block ``t`` attends to the ``L = nw * S`` keys
around it (``nl`` blocks to the left, ``nr`` to the right). The work is done per *stream*
(one batch element, head and, for dilated patterns, residue class) on plain 2-D views of the
caller's tensors: the key windows of a run of blocks are one strided view (``as_strided``,
no copy), so each chunk of blocks is one ``baddbmm`` for the scores (scale and band edges
fused in), one softmax and one ``bmm`` for the output, written straight into the output.
Only the blocks at the ends of a stream, whose window leaves ``[0, Nk)``, go through small
zero-padded copies. The backward pass recomputes the scores from the saved log-sum-exp (as
flash attention does). No ``N x N``, no ``N x L`` tensor and no padded copy of the inputs is
made, forward or backward: on CPU every large allocation costs page faults, so the kernel
allocates the output (and the three input gradients) and nothing else of size ``N``.

Patterns (:class:`attn.Band`):

* sliding window ``|i - j| <= w``: the band itself;
* dilated ``(i - j) % r == 0 and |i - j| <= r*w``: each residue class ``c`` of positions
  (rows ``c::r``, a strided view) is a plain window ``w`` over its own keys;
* global tokens ``i < g or j < g or band``: rows ``i < g`` are dense (O(g*N)); the other rows
  take the band (keys ``j < g`` removed from it) and the ``g`` global columns in one softmax.

A position bias (score_mod) is evaluated on the computed blocks only (O(N*L)) and receives
gradients. Rows with no allowed key give zeros, forward and backward. Rows that fit in one
block (KV-cache decoding) skip the stream loop: one dense product over the keys the band can
reach (``_key_span_attention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attn.base import Attention, Band, KernelPath
from attn.kernels.base import Kernel
from attn.mods import ScoreMod

#: scores per chunk of blocks (elements): ~4 MB in fp32, so the softmax passes stay in cache
CHUNK_ELEMENTS = 1 << 20


def block_size(window: int) -> int:
    """Query block size for a window: about ``w/2`` (so ``L = S + 2w`` wastes ~25%), 16..64."""
    return max(16, min(64, window // 2 if window >= 32 else window))


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


@dataclass(frozen=True)
class _Geometry:
    """Block layout of one call: block ``S``, ``nl``/``nr`` key blocks left/right, chunking."""

    s: int
    nl: int
    nr: int
    chunk: int  # blocks per chunk

    @property
    def nw(self) -> int:
        return self.nl + 1 + self.nr

    @property
    def length(self) -> int:  # L, keys per query block
        return self.nw * self.s


@dataclass(frozen=True)
class _Stream:
    """One (batch, head, residue class): rows ``q_rows`` of the queries, ``k_rows`` of the keys.

    In the stream's own coordinates query row ``m`` sits at position ``q_offset + m`` and key
    row ``n`` at ``n``; absolute positions are ``r * position + residue``. ``block0`` numbers
    the stream's first query block among all streams (the score-bias layout).
    """

    b: int
    h: int
    residue: int
    q_rows: slice
    k_rows: slice
    nq: int
    nk: int
    q_offset: int
    block0: int

    def n_blocks(self, s: int) -> int:
        """Query blocks of ``s`` rows covering the stream (the last one may be partial)."""
        return -(-self.nq // s)

    def view(self, x: Tensor, rows: slice) -> Tensor:
        """The stream's 2-D (or 1-D) view of ``x (B|1, H|1, N, ...)``: no copy."""
        return x[min(self.b, x.shape[0] - 1), min(self.h, x.shape[1] - 1), rows]

    def chunks(self, geo: _Geometry) -> list[tuple[int, int, bool]]:
        """Block ranges ``(t0, t1, interior)``; interior blocks are full and their window lies
        inside ``[0, nk)``, so they read the inputs through views; the rest are padded copies."""
        s = geo.s
        a0 = self.q_offset - geo.nl * s  # position of block 0's first window key
        nb = self.n_blocks(s)
        first = min(nb, max(0, -(a0 // s)))
        last = max(first, min(self.nq // s, (self.nk - a0 - geo.length) // s + 1))
        out = []
        for lo, hi, interior in ((0, first, False), (first, last, True), (last, nb, False)):
            out += [(t, min(t + geo.chunk, hi), interior) for t in range(lo, hi, geo.chunk)]
        return out


def _streams(batch: int, heads: int, q_len: int, k_len: int, q_offset: int, r: int,
             s: int) -> list[_Stream]:
    """Streams in (b, h, residue) order; residue ``c`` holds positions ``i % r == c``."""
    streams, block0 = [], 0
    for b in range(batch):
        for h in range(heads):
            for c in range(r):
                row0 = (c - q_offset) % r  # first query row whose position is in class c
                nq = len(range(row0, q_len, r))
                if nq == 0:
                    continue
                st = _Stream(b, h, c, slice(row0, None, r), slice(c, None, r), nq,
                             len(range(c, k_len, r)), (q_offset + row0) // r, block0)
                streams.append(st)
                block0 += st.n_blocks(s)
    return streams


def _span(x: Tensor, start: int, length: int, fill: float = 0.0) -> Tensor:
    """Rows ``[start, start + length)`` of ``x (N, ...)`` as a new tensor, ``fill`` outside."""
    out = x.new_full((length, *x.shape[1:]), fill)
    lo, hi = max(start, 0), min(start + length, x.shape[0])
    if hi > lo:
        out[lo - start : hi - start] = x[lo:hi]
    return out


def _span_bias(key_bias: Tensor | None, n: int, start: int, length: int, like: Tensor) -> Tensor:
    """Additive key bias ``(length,)`` for keys ``[start, start + length)`` of ``n``: -inf
    outside ``[0, n)``, ``key_bias (n,)`` (or 0) inside; only the span is allocated."""
    if key_bias is not None:
        return _span(key_bias, start, length, float("-inf"))
    out = like.new_full((length,), float("-inf"))
    lo, hi = max(start, 0), min(start + length, n)
    if hi > lo:
        out[lo - start : hi - start] = 0.0
    return out


def _windows(x: Tensor, start: int, count: int, step: int, length: int) -> Tensor:
    """View ``(count, length, ...)``: rows ``start + t*step + [0, length)`` of ``x (N, ...)``."""
    stride = x.stride()
    return x.as_strided((count, length, *x.shape[1:]), (step * stride[0], *stride),
                        x.storage_offset() + start * stride[0])


class _Chunk:
    """Operands of one chunk of blocks ``[t0, t1)`` of a stream, views or padded copies.

    ``q (c*S, D)``, ``k, v`` windows ``(c, L, D|Dv)``, ``key_bias (c, 1, L)`` or None; ``lo, hi``
    the valid query rows of the chunk (``hi - lo < c*S`` only for a partial last block).
    """

    def __init__(self, st: _Stream, geo: _Geometry, t0: int, t1: int, interior: bool,
                 keys: _Keys):
        s, length = geo.s, geo.length
        q2, k2, v2, kb1 = keys.q2, keys.k2, keys.v2, keys.kb1
        self.s, self.c = s, t1 - t0
        c = self.c
        self.interior = interior
        self.lo, self.hi = t0 * s, min(t1 * s, st.nq)
        self.k_start = st.q_offset - geo.nl * s + t0 * s  # first window key of block t0
        self.span = (c + geo.nw - 1) * s  # keys covered by the chunk's windows
        if interior:
            self.q = q2[self.lo : self.hi]
            self.k = _windows(k2, self.k_start, c, s, length)
            self.v = _windows(v2, self.k_start, c, s, length)
            self.key_bias = None
            if kb1 is not None:
                a, b = self.k_start, self.k_start + self.span
                if int(keys.kb_prefix[b]) > int(keys.kb_prefix[a]):  # a masked key in these windows
                    self.key_bias = _windows(kb1, self.k_start, c, s, length).unsqueeze(1)
        else:
            self.q = _span(q2, self.lo, c * s)
            self.k_span, self.v_span = _span(k2, self.k_start, self.span), _span(v2, self.k_start, self.span)
            self.k = _windows(self.k_span, 0, c, s, length)
            self.v = _windows(self.v_span, 0, c, s, length)
            self.key_bias = _windows(_span_bias(kb1, st.nk, self.k_start, self.span, q2), 0, c, s,
                                     length).unsqueeze(1)

    def rows(self, x: Tensor, fill: float = 0.0) -> Tensor:
        """The chunk's query rows of a per-query stream view ``x (nq, ...)``, ``fill`` on padding."""
        return x[self.lo : self.hi] if self.interior else _span(x, self.lo, self.c * self.s, fill)

    def scatter_keys(self, dst: Tensor, grad_windows: Tensor, geo: _Geometry) -> None:
        """``dst (nk, D) +=`` the window gradients ``(c, L, D)``, overlapping windows summed."""
        s = geo.s
        if self.interior:
            for u in range(geo.nw):
                a = self.k_start + u * s
                dst[a : a + self.c * s].unflatten(0, (self.c, s)).add_(grad_windows[:, u * s : (u + 1) * s])
            return
        acc = dst.new_zeros(self.span, dst.shape[-1])
        for u in range(geo.nw):
            acc[u * s : (u + self.c) * s].unflatten(0, (self.c, s)).add_(grad_windows[:, u * s : (u + 1) * s])
        lo, hi = max(self.k_start, 0), min(self.k_start + self.span, dst.shape[0])
        if hi > lo:
            dst[lo:hi].add_(acc[lo - self.k_start : hi - self.k_start])


class _Keys:
    """Per-stream inputs of the core: the stream views and the optional global columns."""

    def __init__(self, st: _Stream, q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor | None,
                 key_masked: Tensor | None, num_global: int, global_bias: Tensor | None):
        self.q2, self.k2, self.v2 = st.view(q, st.q_rows), st.view(k, st.k_rows), st.view(v, st.k_rows)
        self.kb1 = None if key_bias is None else st.view(key_bias, st.k_rows)
        self.kb_prefix = None  # (nk + 1,) on the host: masked keys before each position
        if key_masked is not None:
            masked = st.view(key_masked, st.k_rows).to(torch.int64)
            self.kb_prefix = torch.cat([masked.new_zeros(1), masked.cumsum(0)])
        g = num_global
        self.kx = k[st.b, st.h, :g] if g else None  # (g, D) global keys (all residues)
        self.vx = v[st.b, st.h, :g] if g else None
        self.gb = None if global_bias is None else global_bias[min(st.b, global_bias.shape[0] - 1)]


def _chunk_rows(geo: _Geometry, streams: list[_Stream]) -> int:
    """Blocks in the largest chunk of any stream (the size of the score buffers)."""
    return min(geo.chunk, max(st.n_blocks(geo.s) for st in streams))


def _chunk_scores(ch: _Chunk, keys: _Keys, edges: Tensor, buf: Tensor, scale: float,
                  score_bias: Tensor | None, global_score_bias: Tensor | None, blocks: slice):
    """Scores of a chunk: band ``(c, S, L)`` (into ``buf``) and global columns ``(c*S, g)``."""
    c, s = ch.c, ch.s
    sc = torch.baddbmm(edges, ch.q.unflatten(0, (c, s)), ch.k.transpose(1, 2), alpha=scale,
                       out=buf[:c])  # (c, S, L)
    if ch.key_bias is not None:
        sc.add_(ch.key_bias)
    if score_bias is not None:
        sc.add_(score_bias[blocks])
    sg = None
    if keys.kx is not None:
        sg = torch.mm(ch.q, keys.kx.t()).mul_(scale)  # (c*S, g)
        if keys.gb is not None:
            sg.add_(keys.gb)
        if global_score_bias is not None:
            sg.add_(global_score_bias[blocks].flatten(0, 1))
    return sc, sg


class _BandCore(torch.autograd.Function):
    """Band (+ global columns) softmax attention over all streams; see the module docstring.

    ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)`` with unit last stride;
    ``key_bias (B|1, H|1, Nk)`` additive (0 / -inf) or None; ``global_bias (B|1, g)`` additive
    or None; ``score_bias (T|1, S, L)`` and ``global_score_bias (T|1, S, g)`` per query block
    (``T`` blocks over all streams) or None. Returns ``out (B, H, Nq, Dv)``.
    """

    @staticmethod
    def forward(ctx: Any, q, k, v, key_bias, global_bias, score_bias, global_score_bias, edges,
                geo: _Geometry, streams: list[_Stream], num_global: int):
        batch, heads, q_len, dim = q.shape
        scale = 1.0 / math.sqrt(dim)
        out = q.new_empty(batch, heads, q_len, v.shape[-1])  # (B, H, Nq, Dv)
        lse = q.new_empty(batch, heads, q_len)  # (B, H, Nq)
        buf = q.new_empty(_chunk_rows(geo, streams), geo.s, geo.length)  # (chunk, S, L) scores
        tiny = torch.finfo(q.dtype).tiny
        # masked keys, on the host once: each chunk checks its windows without a device sync
        key_masked = None if key_bias is None else torch.isneginf(key_bias).cpu()
        for st in streams:
            keys = _Keys(st, q, k, v, key_bias, key_masked, num_global, global_bias)
            o2, l1 = st.view(out, st.q_rows), st.view(lse, st.q_rows)
            for t0, t1, interior in st.chunks(geo):
                ch = _Chunk(st, geo, t0, t1, interior, keys)
                blocks = slice(st.block0 + t0, st.block0 + t1)
                sc, sg = _chunk_scores(ch, keys, edges, buf, scale, score_bias, global_score_bias, blocks)
                m = sc.amax(dim=-1)  # (c, S)
                if sg is not None:
                    m = torch.maximum(m, sg.amax(dim=-1).view_as(m))
                m.masked_fill_(torch.isneginf(m), 0.0)
                sc.sub_(m.unsqueeze(-1)).exp_()
                den = sc.sum(dim=-1)  # (c, S)
                o = o2[ch.lo : ch.hi] if interior else o2.new_empty(ch.c * ch.s, o2.shape[-1])
                torch.bmm(sc, ch.v, out=o.unflatten(0, (ch.c, ch.s)))  # (c, S, Dv)
                if sg is not None:
                    sg.sub_(m.view(-1, 1)).exp_()
                    den += sg.sum(dim=-1).view_as(den)
                    o.addmm_(sg, keys.vx)
                den = den.flatten()
                o.div_(den.clamp_min(tiny).unsqueeze(-1))
                row_lse = m.flatten().add_(den.log())  # -inf where no key
                if not interior:
                    n = ch.hi - ch.lo
                    o2[ch.lo : ch.hi] = o[:n]
                    row_lse = row_lse[:n]
                l1[ch.lo : ch.hi] = row_lse
        ctx.save_for_backward(q, k, v, key_bias, global_bias, score_bias, global_score_bias, edges,
                              out, lse)
        ctx.geo, ctx.streams, ctx.num_global, ctx.key_masked = geo, streams, num_global, key_masked
        return out

    @staticmethod
    def backward(ctx: Any, d_out):
        q, k, v, key_bias, global_bias, score_bias, global_score_bias, edges, out, lse = ctx.saved_tensors
        geo, streams, num_global, key_masked = ctx.geo, ctx.streams, ctx.num_global, ctx.key_masked
        scale = 1.0 / math.sqrt(q.shape[-1])
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(dim=-1)  # (B, H, Nq)
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row written once
        dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        want_bias = score_bias is not None and ctx.needs_input_grad[5]
        want_gbias = global_score_bias is not None and ctx.needs_input_grad[6]
        n_blocks = sum(st.n_blocks(geo.s) for st in streams)
        d_bias = q.new_empty(n_blocks, geo.s, geo.length) if want_bias else None
        d_gbias = q.new_empty(n_blocks, geo.s, num_global) if want_gbias else None
        rows = _chunk_rows(geo, streams)
        buf = q.new_empty(rows, geo.s, geo.length)  # probabilities
        buf_ds = torch.empty_like(buf)  # dP, then dS
        buf_dk = q.new_empty(rows, geo.length, q.shape[-1])  # window gradients
        buf_dv = q.new_empty(rows, geo.length, v.shape[-1])
        for st in streams:
            keys = _Keys(st, q, k, v, key_bias, key_masked, num_global, global_bias)
            do2, dl1, ls1 = st.view(d_out, st.q_rows), st.view(delta, st.q_rows), st.view(lse, st.q_rows)
            dq2, dk2, dv2 = st.view(dq, st.q_rows), st.view(dk, st.k_rows), st.view(dv, st.k_rows)
            for t0, t1, interior in st.chunks(geo):
                ch = _Chunk(st, geo, t0, t1, interior, keys)
                c, s = ch.c, ch.s
                blocks = slice(st.block0 + t0, st.block0 + t1)
                p, pg = _chunk_scores(ch, keys, edges, buf, scale, score_bias, global_score_bias, blocks)
                ls = ch.rows(ls1, float("inf")).view(c, s, 1)  # padding rows: P = 0
                p.sub_(ls).exp_()  # (c, S, L) probabilities
                do = ch.rows(do2)  # (c*S, Dv), zero on padding rows
                dow = do.unflatten(0, (c, s))
                dl = ch.rows(dl1).view(c, s, 1)
                dvw = torch.bmm(p.transpose(1, 2), dow, out=buf_dv[:c])  # (c, L, Dv)
                ds = torch.bmm(dow, ch.v.transpose(1, 2), out=buf_ds[:c])  # dP (c, S, L)
                ds.sub_(dl).mul_(p)  # dS = P * (dP - delta)
                if d_bias is not None:
                    d_bias[blocks] = ds
                dqc = dq2[ch.lo : ch.hi] if interior else q.new_empty(c * s, q.shape[-1])
                torch.bmm(ds, ch.k, out=dqc.unflatten(0, (c, s))).mul_(scale)  # (c, S, D)
                dkw = buf_dk[:c].baddbmm_(ds.transpose(1, 2), ch.q.unflatten(0, (c, s)), beta=0.0,
                                          alpha=scale)  # (c, L, D)
                if pg is not None:
                    pg.sub_(ls.view(-1, 1)).exp_()  # (c*S, g)
                    dsg = torch.mm(do, keys.vx.t()).sub_(dl.view(-1, 1)).mul_(pg)
                    if d_gbias is not None:
                        d_gbias[blocks] = dsg.view(c, s, -1)
                    dqc.addmm_(dsg, keys.kx, alpha=scale)
                    dk[st.b, st.h, :num_global].addmm_(dsg.t(), ch.q, alpha=scale)
                    dv[st.b, st.h, :num_global].addmm_(pg.t(), do)
                if not interior:
                    dq2[ch.lo : ch.hi] = dqc[: ch.hi - ch.lo]
                ch.scatter_keys(dk2, dkw, geo)
                ch.scatter_keys(dv2, dvw, geo)
        if d_bias is not None and d_bias.shape != score_bias.shape:
            d_bias = d_bias.sum_to_size(score_bias.shape)
        if d_gbias is not None and d_gbias.shape != global_score_bias.shape:
            d_gbias = d_gbias.sum_to_size(global_score_bias.shape)
        return dq, dk, dv, None, None, d_bias, d_gbias, None, None, None, None


def _score_biases(score_mod: ScoreMod, streams: list[_Stream], geo: _Geometry, dilation: int,
                  num_global: int, dtype: torch.dtype, device: torch.device
                  ) -> tuple[Tensor, Tensor | None]:
    """A score_mod evaluated on every computed block: ``(T, S, L)`` and ``(T, S, g)`` or None.

    Block ``t`` of a stream holds queries at sub-positions ``q_offset + t*S + a`` and window
    keys at ``q_offset - nl*S + t*S + col``; absolute positions are ``r * sub + residue``.
    """
    s, r = geo.s, dilation
    per_stream = [(st, torch.arange(st.n_blocks(s), device=device)) for st in streams]
    t_pos = torch.cat([r * (st.q_offset + t * s) + st.residue for st, t in per_stream])  # (T,)
    b = torch.cat([torch.full_like(t, st.b) for st, t in per_stream]).view(-1, 1, 1)
    h = torch.cat([torch.full_like(t, st.h) for st, t in per_stream]).view(-1, 1, 1)
    i = t_pos.view(-1, 1, 1) + r * torch.arange(s, device=device).view(1, s, 1)  # (T, S, 1)
    cols = r * (torch.arange(geo.length, device=device) - geo.nl * s)
    j = t_pos.view(-1, 1, 1) + cols.view(1, 1, -1)  # (T, 1, L)
    zero = torch.zeros((), dtype=dtype, device=device)
    band = score_mod(zero, b, h, i, j).to(dtype).expand(len(t_pos), s, geo.length)
    if not num_global:
        return band, None
    jg = torch.arange(num_global, device=device).view(1, 1, -1)
    return band, score_mod(zero, b, h, i, jg).to(dtype).expand(len(t_pos), s, num_global)


def _banded(q: Tensor, k: Tensor, v: Tensor, band: Band, *, causal: bool, q_offset: int,
            key_mask: Tensor | None, score_mod: ScoreMod | None, block: int | None,
            chunk: int | None) -> Tensor:
    """Rows of ``q (B, H, Nq, D)`` at positions ``q_offset + row`` (none of them global rows)
    over ``k, v (B, H, Nk, .)``: the band (keys ``j < g`` removed) plus the global columns."""
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    r, g = band.dilation, band.num_global
    s = block or block_size(band.window)
    nl = math.ceil(band.window / s)
    nr = 0 if causal else nl
    geo = _Geometry(s, nl, nr, chunk or max(1, CHUNK_ELEMENTS // (s * (nl + 1 + nr) * s)))
    key_bias = None  # (B|1, 1, Nk)
    if key_mask is not None or g > 0:
        valid = torch.ones(1, 1, k_len, dtype=torch.bool, device=q.device)
        if key_mask is not None:
            valid = valid & key_mask.view(batch, 1, k_len)
        if g > 0:
            valid = valid & (torch.arange(k_len, device=q.device) >= g)
        key_bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device)
        key_bias.masked_fill_(~valid, float("-inf"))
    gk = min(g, k_len)
    global_bias = None  # (B, g)
    if gk and key_mask is not None:
        global_bias = torch.zeros(batch, gk, dtype=q.dtype, device=q.device)
        global_bias.masked_fill_(~key_mask[:, :gk], float("-inf"))
    streams = _streams(batch, heads, q_len, k_len, q_offset, r, s)
    edges = band_edges(s, nl, nr, band.window, causal, q.dtype, q.device)
    score_bias = global_score_bias = None
    if score_mod is not None:
        score_bias, global_score_bias = _score_biases(score_mod, streams, geo, r, gk, q.dtype, q.device)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return _BandCore.apply(q, k, v, key_bias, global_bias, score_bias, global_score_bias, edges,
                           geo, streams, gk)


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
    # an empty row divides its zeros by 1, not by a tiny clamp: 1 / tiny would scale the
    # row's incoming gradient past the float range, and 0 * inf is NaN in the backward
    has_key = den > 0
    safe = torch.where(has_key, den, torch.ones_like(den))
    out = torch.matmul(p, v) / safe  # empty rows: 0
    lse = torch.where(has_key, m + safe.log(), torch.full_like(m, float("-inf")))
    return out, lse.squeeze(-1)


def global_rows(q_len: int, k_len: int, num_global: int) -> int:
    """How many of the (bottom-right aligned) query rows are global rows (``i < g``)."""
    return min(max(num_global - (k_len - q_len), 0), q_len) if num_global > 0 else 0


def uses_key_span(q_len: int, band: Band, block: int | None = None) -> bool:
    """True when the rows fit in one query block (KV-cache decoding): then one dense product
    over the keys the band can reach beats the per-stream block loop."""
    return q_len <= (block or block_size(band.window))


def _key_span_attention(q: Tensor, k: Tensor, v: Tensor, band: Band, *, causal: bool,
                        q_offset: int, key_mask: Tensor | None, score_mod: ScoreMod | None) -> Tensor:
    """Non-global rows ``q (B, H, Nq, D)`` at positions ``q_offset + row``, few of them: dense
    attention over the only keys they can reach (the band's span and the global columns),
    ``O(Nq * (Nq + 2*r*w + g))``."""
    q_len, k_len = q.shape[2], k.shape[2]
    reach = band.dilation * band.window
    lo = max(q_offset - reach, 0)
    hi = min(q_offset + q_len + (0 if causal else reach), k_len)  # exclusive
    g = min(band.num_global, k_len)
    j = torch.arange(min(g, lo), device=q.device)  # global columns left of the span
    j = torch.cat([j, torch.arange(lo, max(hi, lo), device=q.device)])  # (n,)
    i = torch.arange(q_offset, q_offset + q_len, device=q.device)  # (Nq,)
    diff = i.view(-1, 1) - j.view(1, -1)  # (Nq, n) = i - j
    allowed = (diff.abs() <= reach) & (diff % band.dilation == 0)
    if causal:
        allowed &= diff >= 0
    allowed |= j.view(1, -1) < band.num_global  # global columns (every row here has i >= g)
    allowed = allowed.view(1, 1, q_len, -1)
    if key_mask is not None:
        allowed = allowed & key_mask[:, j].view(key_mask.shape[0], 1, 1, -1)
    out, _ = _dense_part(q, k[:, :, j], v[:, :, j], i, j, allowed, score_mod)
    return out  # (B, H, Nq, Dv)


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
    chunk: int | None = None,
) -> Tensor:
    """Exact banded attention (sliding window, dilated, global tokens) in O(N*w) time.

    ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``, ``v (B, H, Nk, Dv)`` -> ``(B, H, Nq, Dv)``;
    positions bottom-right aligned. ``block`` (query rows per block) and ``chunk`` (blocks per
    chunk) override the tuned defaults.
    """
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    dtype = q.dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    q_len, k_len = q.shape[2], k.shape[2]
    g = band.num_global
    offset = k_len - q_len
    n_glob_rows = global_rows(q_len, k_len, g)
    band_out = None
    if n_glob_rows < q_len:
        rows, row_offset = q[:, :, n_glob_rows:], offset + n_glob_rows
        if uses_key_span(q_len - n_glob_rows, band, block):
            band_out = _key_span_attention(rows, k, v, band, causal=causal, q_offset=row_offset,
                                           key_mask=key_mask, score_mod=score_mod)
        else:
            band_out = _banded(rows, k, v, band, causal=causal, q_offset=row_offset,
                               key_mask=key_mask, score_mod=score_mod, block=block, chunk=chunk)
    if n_glob_rows == 0:
        result = band_out
    else:  # global rows: dense over every key (causal: j <= i)
        batch = q.shape[0]
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

    def not_supported_reasons(self, attention, call) -> list[str]:
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
        band_rows = q_len - n_neg - global_rows(q_len - n_neg, k_len, band.num_global)
        if uses_key_span(band_rows, band):
            path = f"dense over the band's key span, Nq <= one block ({', '.join(parts)})"
        else:
            path = f"banded blocks ({', '.join(parts)})"
        return out, KernelPath(self.name, path, fallback=fallback)
