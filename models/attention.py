"""Multi-head attention over any registered attention, with an optional KV cache and RoPE (docs/models.md)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

import attn
from attn.devices import module_device
from attn.mods import index_grids
from attn.validation import invalid

#: the RoPE base (Su et al. 2021): pair i of a head of D channels turns by pos * base^(-2i/D)
ROPE_BASE = 10000.0


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE), no parameters, half-split pairing (docs/models.md, "RoPE")."""

    def __init__(self, head_dim: int, base: float = ROPE_BASE) -> None:
        super().__init__()
        if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise invalid("head_dim", f"must be an even integer >= 2 for rotary positions "
                                      f"(RoPE turns pairs of channels); got {head_dim!r}")
        if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 1):
            raise invalid("base", f"must be a finite number > 1; got {base!r}")
        self.head_dim = head_dim
        self.base = float(base)

    def angles(self, positions: Tensor) -> Tensor:
        """Angles ``pos * base^(-2i/D)``, float64: ``positions (B, N)`` -> ``(B, 1, N, D/2)``."""
        pairs = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=positions.device)
        inv_freq = self.base ** (-pairs / self.head_dim)  # (D/2,)
        return positions.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, N, D/2)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x (B, H, N, D)`` rotated by ``positions (B, N)`` or ``(1, N)`` (integers, absolute)."""
        if positions.dim() != 2 or positions.shape[1] != x.shape[2]:
            raise invalid("positions", f"must have shape (B, {x.shape[2]}) or (1, {x.shape[2]}) "
                                       f"for {x.shape[2]} tokens; got {tuple(positions.shape)}")
        angle = self.angles(positions)  # (B, 1, N, D/2)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2 :]  # (B, H, N, D/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, N, D)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, convention='half-split'"


def default_positions(length: int, offset: int, device: torch.device) -> Tensor:
    """Positions ``offset .. offset + length - 1`` of every row, ``(1, N)``."""
    return torch.arange(offset, offset + length, device=device)[None, :]  # (1, N)


def pattern_shift_reason(attention: attn.Attention, probe: int = 48, shift: int = 29) -> str | None:
    """Why ``attention``'s pattern is not a function of ``j - i`` alone (what left padding needs), or None: probed on
    a ``probe x probe`` grid against the same grid moved by ``shift``; global positions are refused."""
    band = attention.band()
    if band is not None and band.num_global > 0:
        return f"its first {band.num_global} position(s) are global, an absolute position"
    heads = attention.num_heads or 1
    device = module_device(attention)  # a score_mod may read its tensors
    b, h, i, j = index_grids(1, heads, probe, probe, device)
    shape = (1, heads, probe, probe)
    with torch.no_grad():
        mask_mod = attention.mask_mod()
        if mask_mod is not None:
            here = torch.broadcast_to(mask_mod(b, h, i, j), shape)
            there = torch.broadcast_to(mask_mod(b, h, i + shift, j + shift), shape)
            if not torch.equal(here, there):
                return "its mask_mod depends on absolute positions, not on j - i alone"
        score_mod = attention.score_mod()
        if score_mod is not None:
            zero = torch.zeros(shape, device=device)
            here = torch.broadcast_to(score_mod(zero, b, h, i, j), shape)
            there = torch.broadcast_to(score_mod(zero, b, h, i + shift, j + shift), shape)
            if not torch.allclose(here, there):
                return "its score_mod depends on absolute positions, not on j - i alone"
    return None


class KVCache:
    """Keys and values of past positions for one attention layer, ``(B, H_kv, T, D)``: the first ``keep_first``
    and last ``keep_last`` (all when None; :func:`cache_policy`). A ``static`` cache (cross attention) is set once;
    ``seen`` counts every position appended, trimmed or not (the offset RoPE rotates by)."""

    def __init__(self, keep_first: int = 0, keep_last: int | None = None, static: bool = False):
        self.keep_first = keep_first
        self.keep_last = keep_last
        self.static = static
        self.seen = 0
        self.k: Tensor | None = None  # (B, H, T, D): a view of the buffer when unbounded
        self.v: Tensor | None = None
        self.mask: Tensor | None = None  # (B, T) bool, True at real keys; None: all real
        self._k_buf: Tensor | None = None  # (B, H, capacity, D), grown by doubling
        self._v_buf: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held: key and value storage (grown buffers, capacity included) and the key mask."""
        held = (self._k_buf, self._v_buf) if self._k_buf is not None else (self.k, self.v)
        held += (self.mask,)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def update(
        self, k: Tensor, v: Tensor, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append ``k, v (B, H_kv, Nnew, D)`` and their ``key_mask (B, Nnew)``; return the keys, values and
        key mask (None: all real) the new queries need."""
        if self.static:
            self.k, self.v = k, v
            return k, v, key_mask
        batch, new = k.shape[0], k.shape[2]
        if key_mask is not None and (key_mask.dtype != torch.bool or tuple(key_mask.shape) != (batch, new)):
            raise invalid("key_mask", f"must be a bool tensor of shape ({batch}, {new}) for the new "
                                      f"tokens; got {key_mask.dtype} of shape {tuple(key_mask.shape)}")
        mask = None  # (B, T + Nnew): the mask of the keys returned
        if key_mask is not None or self.mask is not None:
            past = self.mask if self.mask is not None else k.new_ones(batch, self.length, dtype=torch.bool)
            now = key_mask if key_mask is not None else k.new_ones(batch, new, dtype=torch.bool)
            mask = torch.cat([past, now], dim=1)
        self.seen += new
        if self.keep_last is None:
            self._append(k, v)  # amortised O(Nnew): no copy of the past per step
            self.mask = mask
            return self.k, self.v, mask
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)  # (B, H, T + Nnew, D), T bounded by the band
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = self._trim(k), self._trim(v)
        self.mask = None if mask is None else self._trim(mask, dim=1)
        return k, v, mask

    def _append(self, k: Tensor, v: Tensor) -> None:
        old, new = self.length, k.shape[2]
        if self._k_buf is None or old + new > self._k_buf.shape[2]:
            capacity = max(2 * (old + new), 16)
            k_buf = k.new_empty(*k.shape[:2], capacity, k.shape[3])
            v_buf = v.new_empty(*v.shape[:2], capacity, v.shape[3])
            if old:
                k_buf[:, :, :old] = self.k
                v_buf[:, :, :old] = self.v
            self._k_buf, self._v_buf = k_buf, v_buf
        self._k_buf[:, :, old : old + new] = k
        self._v_buf[:, :, old : old + new] = v
        self.k = self._k_buf[:, :, : old + new]
        self.v = self._v_buf[:, :, : old + new]

    def _trim(self, x: Tensor, dim: int = 2) -> Tensor:
        length = x.shape[dim]
        if self.keep_last is None or length <= self.keep_first + self.keep_last:
            return x
        tail = x.narrow(dim, length - self.keep_last, self.keep_last)
        return tail if self.keep_first == 0 else torch.cat([x.narrow(dim, 0, self.keep_first), tail], dim=dim)

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search)."""
        if self.k is None:
            return
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)
        if self._k_buf is not None:
            self._k_buf = self._k_buf.index_select(0, index)
            self._v_buf = self._v_buf.index_select(0, index)
            self.k = self._k_buf[:, :, : self.length]
            self.v = self._v_buf[:, :, : self.length]
        else:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def check_kv_heads(num_heads: int, num_kv_heads: int) -> None:
    """``ValueError`` naming ``num_kv_heads`` unless it is an integer >= 1 dividing ``num_heads``."""
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads < 1 \
            or num_heads % num_kv_heads:
        raise invalid("num_kv_heads", f"must be an integer >= 1 that divides num_heads={num_heads} "
                                      f"(each key head serves num_heads / num_kv_heads query heads); "
                                      f"got {num_kv_heads!r}")


class StateCache:
    """A layer's decoding state (the attention's ``new_decoding_state()``) in place of a KV cache."""

    static = False

    def __init__(self, state: Any) -> None:
        self.state = state
        self.seen = 0

    @property
    def length(self) -> int:
        return self.seen

    def step(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Causal attention of ``q (B, H, Nnew, Dh)`` over every key fed so far plus ``k, v``, which are fed."""
        out = self.state.step(q, k, v, key_mask)
        self.seen += k.shape[2]
        return out

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search)."""
        self.state.reorder(index)


def cache_policy(attention: attn.Attention) -> tuple[int, int | None]:
    """``(keep_first, keep_last)`` that keeps cached decoding exact: a band (w, r, g globals) reaches the last
    ``r*w + 1`` keys and the first g; globals with a score_mod keep all ([globals, recent] would shift ``j - i``)."""
    band = attention.band()
    if band is None:
        return 0, None
    if band.num_global > 0 and attention.score_mod() is not None:
        return 0, None
    return band.num_global, band.dilation * band.window + 1


class MultiHeadAttention(nn.Module):
    """Q/K/V/output projections around any registered attention (self or cross); ``num_kv_heads`` (default
    ``num_heads``, which it must divide): grouped-query key/value heads; ``rope=True``: rotated queries and keys."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        attention: str = "full",
        attention_params: dict[str, Any] | None = None,
        kernel: str = "auto",
        rope: bool = False,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model: must be divisible by num_heads={num_heads}; got {d_model}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_kv_heads(num_heads, num_kv_heads)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        if rope and self.head_dim % 2:
            raise invalid("head_dim", f"must be even for rotary positions (rope=True); got "
                                      f"d_model / num_heads = {d_model} / {num_heads} = {self.head_dim}")
        self.rope = RotaryEmbedding(self.head_dim) if rope else None
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attention = attn.create_attention(
            attention,
            num_heads=num_heads,
            head_dim=self.head_dim,
            kernel=kernel,
            **(attention_params or {}),
        )

    def new_cache(self, static: bool = False) -> KVCache | StateCache:
        """An empty cache sized by this layer's pattern, or the attention's own decoding state when it has one."""
        if static:
            return KVCache(static=True)
        new_state = getattr(self.attention, "new_decoding_state", None)
        state = None if new_state is None else new_state()
        if state is not None:
            return StateCache(state)
        keep_first, keep_last = cache_policy(self.attention)
        return KVCache(keep_first, keep_last)

    def split(self, x: Tensor, heads: int | None = None) -> Tensor:
        """``(B, N, heads * Dh)`` -> per-head ``(B, heads, N, Dh)`` (default: the query heads)."""
        batch, length, _ = x.shape
        heads = self.num_heads if heads is None else heads
        return x.view(batch, length, heads, self.head_dim).transpose(1, 2)  # (B, heads, N, Dh)

    def queries(self, x: Tensor) -> Tensor:
        """Per-head queries ``(B, H, Nq, Dh)`` of ``x (B, Nq, D)``."""
        return self.split(self.q_proj(x))

    def keys_values(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head keys and values ``(B, H_kv, Nk, Dh)`` of ``context (B, Nk, D)``."""
        kv = self.num_kv_heads
        return self.split(self.k_proj(context), kv), self.split(self.v_proj(context), kv)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x (B, H, N, Dh)`` rotated by ``positions (B|1, N)`` with RoPE, or unchanged without it."""
        return x if self.rope is None else self.rope(x, positions)

    def project(
        self, x: Tensor, context: Tensor | None = None, *, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head ``q (B, H, Nq, Dh)``, ``k, v (B, H_kv, Nk, Dh)``; with RoPE, ``positions (B|1, Nk)`` (default
        ``offset ..``) place the keys, and queries take the last ``Nq``."""
        context = x if context is None else context
        q, (k, v) = self.queries(x), self.keys_values(context)
        if self.rope is not None:
            if positions is None:
                positions = default_positions(k.shape[2], offset, k.device)  # (1, Nk)
            q, k = self.rotate(q, positions[:, -q.shape[2] :]), self.rotate(k, positions)
        return q, k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Attention over per-head tensors, merged and projected: -> ``(B, Nq, D)``;
        ``document_ids (B, N)``: a packed call (docs/contract.md, "Packed sequences")."""
        packed = {} if document_ids is None else {"document_ids": document_ids}  # plain modules too
        return self.merge(self.attention(q, k, v, causal=causal, key_mask=key_mask, **packed))

    def merge(self, out: Tensor) -> Tensor:
        """Per-head outputs ``(B, H, Nq, Dh)`` merged and projected: -> ``(B, Nq, D)``."""
        batch, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))  # (B, Nq, D)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        causal: bool = False,
        key_mask: Tensor | None = None,
        cache: KVCache | StateCache | None = None,
        positions: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """``x (B, Nq, D)`` attends over ``context`` (default ``x``), through ``cache`` if given; ``key_mask (B, Nnew)``
        masks the new keys; ``positions (B|1, Nnew)``: absolute RoPE positions (default ``cache.seen`` onwards)."""
        if cache is not None and cache.static and cache.k is not None:
            q, k, v = self.queries(x), cache.k, cache.v  # cross attention: memory projected once
        else:  # q (B, H, Nq, Dh), k, v (B, H_kv, Nk, Dh)
            q, k, v = self.project(x, context, positions=positions, offset=0 if cache is None else cache.seen)
            if isinstance(cache, StateCache):
                if not causal:
                    raise invalid("causal", "must be True with a decoding state (it attends causally)")
                return self.merge(cache.step(q, k, v, key_mask))  # (B, Nq, D)
            if cache is not None:
                k, v, key_mask = cache.update(k, v, key_mask)
        return self.attend(q, k, v, causal=causal, key_mask=key_mask, document_ids=document_ids)
