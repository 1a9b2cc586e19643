"""Embeddings: tokens, absolute positions (sinusoidal / learned / none; ``rope`` rotates
queries and keys inside the attention instead, see :mod:`models.attention`), ViT patches."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Token ids ``(B, N)`` -> vectors ``(B, N, D)``, scaled by sqrt(D) as in Vaswani et al."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model**-0.5)  # (V, D)
        self.scale = math.sqrt(d_model)

    def forward(self, ids: Tensor) -> Tensor:
        return nn.functional.embedding(ids, self.weight) * self.scale  # (B, N, D)


def sinusoidal_table(positions: Tensor, d_model: int) -> Tensor:
    """PE(p, 2i) = sin(p / 10000^(2i/D)), PE(p, 2i+1) = cos(...); ``positions (N,)`` -> (N, D)."""
    half = torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)
    freq = torch.exp(-math.log(10000.0) * half / d_model)  # (ceil(D/2),)
    angle = positions.to(torch.float32)[:, None] * freq[None, :]  # (N, ceil(D/2))
    table = torch.zeros(positions.shape[0], d_model, device=positions.device)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table


def first_real(key_mask: Tensor) -> Tensor:
    """The column of each row's first real token, ``key_mask (B, N)`` -> ``(B,)`` (0 for none)."""
    return key_mask.to(torch.int8).argmax(dim=1)  # the first maximum: the first True


def token_positions(length: int, offset: int = 0, start: Tensor | None = None,
                    device: torch.device | None = None) -> Tensor:
    """Positions of ``length`` tokens at columns ``offset ..``: ``(1, N)``, or ``(B, N)`` counted from each row's
    first real column ``start (B,)`` (padding gets 0)."""
    columns = torch.arange(offset, offset + length, device=device)[None, :]  # (1, N)
    return columns if start is None else (columns - start.to(columns.device)[:, None]).clamp(min=0)  # (B, N)


class PositionEmbedding(nn.Module):
    """Absolute positions added to ``x (B, N, D)``: ``offset ..`` or ``positions (B|1, N)``; ``none`` and
    ``rope`` add nothing."""

    def __init__(self, kind: str, d_model: int, max_len: int) -> None:
        super().__init__()
        self.kind = kind
        self.max_len = max_len
        self.d_model = d_model
        self.table = nn.Parameter(torch.zeros(max_len, d_model)) if kind == "learned" else None
        if self.table is not None:
            nn.init.trunc_normal_(self.table, std=0.02)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        if self.kind in ("none", "rope"):
            return x
        length = x.shape[1]
        if positions is None:
            if self.kind == "learned":
                self._check_table(offset + length - 1)
                return x + self.table[offset : offset + length].to(x.dtype)  # (B, N, D)
            columns = torch.arange(offset, offset + length, device=x.device)
            return x + sinusoidal_table(columns, self.d_model).to(x.dtype)  # (B, N, D)
        if self.kind == "learned":
            self._check_table(int(positions.max()) if positions.numel() else 0)
            return x + self.table[positions].to(x.dtype)  # (B|1, N, D) -> (B, N, D)
        table = sinusoidal_table(positions.reshape(-1), self.d_model)  # (B*N, D)
        return x + table.view(*positions.shape, self.d_model).to(x.dtype)  # (B, N, D)

    def _check_table(self, last: int) -> None:
        if last >= self.max_len:
            raise ValueError(f"max_len: position {last} is beyond the learned table of max_len={self.max_len}")

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, max_len={self.max_len}"


class PatchEmbedding(nn.Module):
    """Images ``(B, C, S, S)`` -> non-overlapping patch vectors ``(B, (S/P)^2, D)``."""

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images: expected shape (B, {', '.join(map(str, expected))}); "
                f"got {tuple(images.shape)}"
            )
        x = self.proj(images)  # (B, D, S/P, S/P)
        return x.flatten(2).transpose(1, 2)  # (B, P, D)


class PrefixTokens(nn.Module):
    """Learned ``[CLS]`` (if ``cls``) then ``num_global`` tokens, prepended; under ``global_tokens`` CLS is global."""

    def __init__(self, d_model: int, cls: bool, num_global: int) -> None:
        super().__init__()
        self.count = int(cls) + num_global
        self.tokens = nn.Parameter(torch.zeros(1, self.count, d_model))  # (1, G, D)
        nn.init.trunc_normal_(self.tokens, std=0.02)

    def forward(self, x: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``x (B, N, D)`` -> ``(B, G + N, D)``, extending ``key_mask (B, N)`` with True."""
        if self.count == 0:
            return x, key_mask
        batch = x.shape[0]
        x = torch.cat([self.tokens.expand(batch, -1, -1).to(x.dtype), x], dim=1)  # (B, G+N, D)
        if key_mask is not None:
            ones = key_mask.new_ones(batch, self.count)
            key_mask = torch.cat([ones, key_mask], dim=1)  # (B, G+N)
        return x, key_mask
