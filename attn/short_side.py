"""Unmasked softmax attention with one short side (a few landmarks), streamed along the long one.

Nystromformer's two N-sized products are attention with m (~64) keys for N queries, and with
m queries over N keys. Written as one matmul-softmax-matmul they keep an (N, m) probability
matrix for the backward; PyTorch's CPU flash kernel avoids that but its backward is tuned for
square problems. :func:`short_side_attention` walks the long side in chunks that stay in
cache, keeps only the log-sum-exp per row (as flash attention does) and recomputes each
chunk's probabilities in the backward pass. Memory beyond the output is O(chunk * m),
forward and backward; the gradients are written straight into their N-sized tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attn.precision import without_autocast

#: elements of one chunk's (B, H, c, m) score block, per device type: ~4 MB in fp32 on CPU (in
#: cache); 128 MB on CUDA, so N = 512K is a few chunks, not hundreds of launches (chosen, not
#: yet measured on a GPU)
CHUNK_ELEMENTS: dict[str, int] = {"cpu": 1 << 20, "cuda": 1 << 25}


def chunk_len(batch_heads: int, short: int, chunk: int | None, device: torch.device | str = "cpu") -> int:
    """Rows of the long side per chunk on ``device`` (``chunk`` if given; other device types:
    the CPU's size)."""
    elements = CHUNK_ELEMENTS.get(torch.device(device).type, CHUNK_ELEMENTS["cpu"])
    return chunk or max(1, elements // max(batch_heads * short, 1))


class _LongQueries(torch.autograd.Function):
    """``softmax(q k^T * scale) v`` for ``q (B, H, N, D)`` long and ``k, v (B, H, m, .)`` short."""

    @staticmethod
    @without_autocast
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int) -> Tensor:
        batch, heads, n, _ = q.shape
        out = q.new_empty(batch, heads, n, v.shape[-1])  # (B, H, N, Dv)
        lse = q.new_empty(batch, heads, n, 1)  # (B, H, N, 1)
        kt = k.transpose(-1, -2)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            s = torch.matmul(q[:, :, a:b], kt).mul_(scale)  # (B, H, c, m)
            top = s.amax(dim=-1, keepdim=True)
            p = s.sub_(top).exp_()
            den = p.sum(dim=-1, keepdim=True)
            torch.div(torch.matmul(p, v), den, out=out[:, :, a:b])
            torch.add(top, den.log_(), out=lse[:, :, a:b])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    @without_autocast
    def backward(ctx: Any, d_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        n = q.shape[2]
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        kt, vt = k.transpose(-1, -2), v.transpose(-1, -2)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            qc, do = q[:, :, a:b], d_out[:, :, a:b]  # (B, H, c, D), (B, H, c, Dv)
            p = torch.matmul(qc, kt).mul_(scale).sub_(lse[:, :, a:b]).exp_()  # (B, H, c, m)
            delta = (do * out[:, :, a:b]).sum(dim=-1, keepdim=True)  # (B, H, c, 1)
            dv += torch.matmul(p.transpose(-1, -2), do)
            ds = torch.matmul(do, vt).sub_(delta).mul_(p)  # dS = P * (dP - delta)
            torch.matmul(ds, k, out=dq[:, :, a:b]).mul_(scale)
            dk += torch.matmul(ds.transpose(-1, -2), qc).mul_(scale)
        return dq, dk, dv, None, None


class _LongKeys(torch.autograd.Function):
    """``softmax(q k^T * scale) v`` for ``q (B, H, m, D)`` short and ``k, v (B, H, N, .)`` long."""

    @staticmethod
    @without_autocast
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int) -> Tensor:
        batch, heads, m, _ = q.shape
        n = k.shape[2]
        top = q.new_full((batch, heads, m, 1), float("-inf"))  # running max
        den = q.new_zeros(batch, heads, m, 1)
        acc = q.new_zeros(batch, heads, m, v.shape[-1])  # (B, H, m, Dv)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            s = torch.matmul(q, k[:, :, a:b].transpose(-1, -2)).mul_(scale)  # (B, H, m, c)
            new_top = torch.maximum(top, s.amax(dim=-1, keepdim=True))
            rescale = torch.exp(top - new_top)  # 0 on the first chunk
            p = s.sub_(new_top).exp_()
            den.mul_(rescale).add_(p.sum(dim=-1, keepdim=True))
            acc.mul_(rescale).add_(torch.matmul(p, v[:, :, a:b]))
            top = new_top
        out = acc.div_(den)
        lse = top.add_(den.log())  # (B, H, m, 1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    @without_autocast
    def backward(ctx: Any, d_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        n = k.shape[2]
        dq = torch.zeros_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        delta = (d_out * out).sum(dim=-1, keepdim=True)  # (B, H, m, 1)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            kc, vc = k[:, :, a:b], v[:, :, a:b]  # (B, H, c, D), (B, H, c, Dv)
            p = torch.matmul(q, kc.transpose(-1, -2)).mul_(scale).sub_(lse).exp_()  # (B, H, m, c)
            torch.matmul(p.transpose(-1, -2), d_out, out=dv[:, :, a:b])
            ds = torch.matmul(d_out, vc.transpose(-1, -2)).sub_(delta).mul_(p)  # (B, H, m, c)
            torch.matmul(ds.transpose(-1, -2), q, out=dk[:, :, a:b]).mul_(scale)
            dq += torch.matmul(ds, kc).mul_(scale)
        return dq, dk, dv, None, None


def short_side_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                         chunk: int | None = None) -> Tensor:
    """Unmasked ``softmax(q k^T * scale) v`` for ``q (B, H, Nq, D)``, ``k (B, H, Nk, D)``,
    ``v (B, H, Nk, Dv)``, streamed along the longer of Nq, Nk in chunks of ``chunk`` rows.

    Exact (same math as full attention), autograd through a custom backward.
    """
    batch_heads = q.shape[0] * q.shape[1]
    if q.shape[2] >= k.shape[2]:
        return _LongQueries.apply(q, k, v, scale, chunk_len(batch_heads, k.shape[2], chunk, q.device))
    return _LongKeys.apply(q, k, v, scale, chunk_len(batch_heads, q.shape[2], chunk, q.device))
