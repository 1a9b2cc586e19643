"""The ``factorised`` kernel: a grid pattern (:mod:`attn.grid`) as batched SDPA over frames and over positions
(ViViT), O(N * (S + T)), no ``N x N`` mask (docs/kernels.md); causal is each sequence's own lower triangle."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import expand_how, expand_kv, gqa_note
from attn.grid import Grid
from attn.kernels.base import Kernel, KernelPath
from attn.kernels.sdpa import sdpa_backend
from attn.pattern import Pattern


def _sequences(x: Tensor, axis: str, frames: int, positions: int) -> Tensor:
    """``x (B, H, T*S, D)`` as spatial ``(B*T, H, S, D)`` or temporal ``(B*S, H, T, D)`` sequences."""
    batch, heads, _, dim = x.shape
    grid = x.reshape(batch, heads, frames, positions, dim)  # (B, H, T, S, D)
    if axis == "spatial":
        return grid.permute(0, 2, 1, 3, 4).reshape(batch * frames, heads, positions, dim)
    return grid.permute(0, 3, 1, 2, 4).reshape(batch * positions, heads, frames, dim)


def _tokens(y: Tensor, axis: str, batch: int, frames: int, positions: int) -> Tensor:
    """The inverse of :func:`_sequences`, back to ``(B, H, T*S, Dv)``."""
    heads, dim = y.shape[1], y.shape[-1]
    if axis == "spatial":
        grid = y.reshape(batch, frames, heads, positions, dim).permute(0, 2, 1, 3, 4)
    else:
        grid = y.reshape(batch, positions, heads, frames, dim).permute(0, 2, 3, 1, 4)
    return grid.reshape(batch, heads, frames * positions, dim)  # (B, H, T*S, Dv)


def _axis_attention(q: Tensor, k: Tensor, v: Tensor, axis: str, frames: int, positions: int,
                    causal: bool, valid: Tensor | None) -> tuple[Tensor, str]:
    """One axis of the grid, ``valid (B, T, S)`` the real keys (None: all); returns the output and backend. A row
    with no allowed key has its mask lifted and its output multiplied by 0: no NaN in value or gradient."""
    batch = q.shape[0]
    qs, ks, vs = (_sequences(t, axis, frames, positions) for t in (q, k, v))  # (B*G, H, L, .)
    if valid is None:
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        backend = sdpa_backend(qs, ks, vs, None, causal)
        return _tokens(out, axis, batch, frames, positions), backend
    length = qs.shape[2]
    keys = valid if axis == "spatial" else valid.transpose(1, 2)  # (B, G, L)
    allowed = keys.reshape(-1, 1, 1, length)  # (B*G, 1, 1, L)
    if causal:
        tri = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        allowed = allowed & tri  # (B*G, 1, L, L)
    allowed = allowed.expand(allowed.shape[0], 1, length, length)
    has_key = allowed.any(dim=-1, keepdim=True)  # (B*G, 1, L, 1)
    mask = allowed | ~has_key
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
    out = out * has_key.to(out.dtype)  # rows without a key: zeros, value and gradient
    return _tokens(out, axis, batch, frames, positions), sdpa_backend(qs, ks, vs, mask, False)


def factorised_attention(q: Tensor, k: Tensor, v: Tensor, grid: Grid, *, causal: bool = False,
                         key_mask: Tensor | None = None) -> Tensor:
    """Attention of ``grid``'s pattern: ``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, .)``, ``Nq <= Nk``
    -> ``(B, H, Nq, Dv)``."""
    return _factorised(q, k, v, grid, causal, key_mask)[0]


def _factorised(q: Tensor, k: Tensor, v: Tensor, grid: Grid, causal: bool,
                key_mask: Tensor | None) -> tuple[Tensor, list[str]]:
    """:func:`factorised_attention` and the SDPA backend of each head group."""
    batch, heads, q_len, _ = q.shape
    k, v = expand_kv(k, heads), expand_kv(v, heads)  # (B, H, Nk, .): a head group slices q, k, v alike
    k_len, positions = k.shape[2], grid.positions
    frames = -(-k_len // positions)
    tokens = frames * positions
    valid = key_mask  # (B, Nk) | None
    if tokens != k_len:  # a partial last frame: pad its keys, masked
        pad = tokens - k_len
        k = F.pad(k, (0, 0, 0, pad))
        v = F.pad(v, (0, 0, 0, pad))
        real = torch.arange(tokens, device=q.device) < k_len
        valid = real.expand(batch, tokens) if key_mask is None else F.pad(key_mask, (0, pad))
    if q_len != tokens:  # queries at their absolute rows k_len - q_len .. k_len - 1
        start = k_len - q_len
        q = F.pad(q, (0, 0, start, tokens - k_len))
    valid = None if valid is None else valid.reshape(batch, frames, positions)  # (B, T, S)
    outs, backends = [], []
    for h0, h1, axis in grid.head_groups(heads):
        out, backend = _axis_attention(q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], axis, frames, positions,
                                       causal, valid)
        outs.append(out)
        backends.append(f"{axis}: {backend}")
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (B, H, T*S, Dv)
    if q_len != tokens:
        out = out[:, :, k_len - q_len : k_len]
    return out, backends


class FactorisedKernel(Kernel):
    """Grid patterns as batched SDPA over frames and over positions: O(N * (S + T))."""

    name = "factorised"
    description = "batched attention over frames and over positions of a token grid, O(N*(S+T))"

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        if pattern.grid is None:
            reasons.append(f"{pattern.name} declares no token grid (grid()); {self.name} runs grid patterns only")
        if pattern.score_mod is not None:
            reasons.append(f"{pattern.name} has a score term (score_mod); {self.name} runs mask patterns only")
        if call is not None and call.q_len is not None and call.k_len is not None and call.q_len > call.k_len:
            reasons.append(f"{self.name} needs Nq <= Nk (Nq > Nk puts queries before the first key, "
                           f"off the grid); got Nq={call.q_len}, Nk={call.k_len}")
        return reasons

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        grid = pattern.grid
        out, backends = _factorised(q, k, v, grid, causal, key_mask)  # (B, H, Nq, Dv)
        positions = grid.positions
        frames = -(-k.shape[2] // positions)
        axes = "+".join(axis for _, _, axis in grid.head_groups(q.shape[1]))
        path = f"{axes} over a grid of {frames} frames x {positions} positions (batched SDPA)" + gqa_note(
            q.shape[1], k.shape[1], expand_how(q.shape[1], k.shape[1]))
        return out, KernelPath(self.name, path, backend=", ".join(backends))
