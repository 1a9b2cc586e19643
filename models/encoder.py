"""BERT-style encoder stack and the encoder classifier (CLS / mean / last pooling, per-token logits, dual encoder)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks import make_blocks
from models.config import EncoderClassifierConfig, ModelConfig
from models.embeddings import PositionEmbedding, PrefixTokens, TokenEmbedding
from models.registration import register_model
from models.streaming import StreamingEncoder


class TransformerEncoder(nn.Module):
    """A stack of non-causal blocks (+ final LayerNorm under pre-LN): ``(B, N, D) -> (B, N, D)``."""

    def __init__(self, config: ModelConfig, num_layers: int | None = None, attention: str | None = None,
                 attention_params: dict[str, Any] | None = None) -> None:
        super().__init__()
        layers = config.num_layers if num_layers is None else num_layers
        if attention is None:
            attention, attention_params = config.attention, config.attention_params
        self.blocks = make_blocks(config, layers, attention, dict(attention_params or {}), causal=False)
        self.norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, x: Tensor, key_mask: Tensor | None = None, document_ids: Tensor | None = None) -> Tensor:
        """``x (B, N, D)`` -> ``(B, N, D)``; ``document_ids (B, N)`` packs documents (positions are the caller's)."""
        for block in self.blocks:
            x = block(x, key_mask=key_mask, document_ids=document_ids)
        return self.norm(x)


def masked_mean(x: Tensor, key_mask: Tensor | None) -> Tensor:
    """Mean of ``x (B, N, D)`` over real positions (``key_mask (B, N)``) -> ``(B, D)``."""
    if key_mask is None:
        return x.mean(dim=1)
    weight = key_mask.to(x.dtype).unsqueeze(-1)  # (B, N, 1)
    return (x * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)


def last_real(x: Tensor, key_mask: Tensor | None) -> Tensor:
    """The last real position of ``x (B, N, D)`` (``key_mask (B, N)``, real tokens first) -> ``(B, D)``."""
    if key_mask is None:
        return x[:, -1]
    last = key_mask.long().sum(dim=1).clamp(min=1) - 1  # (B,)
    return x[torch.arange(x.shape[0], device=x.device), last]


def pool(h: Tensor, pooling: str, start: int, key_mask: Tensor | None) -> Tensor:
    """One vector ``(B, D)`` of ``h (B, G + N, D)``, its prefix ``start = G``: CLS, the last real token, or the mean."""
    if pooling == "cls":
        return h[:, 0]
    if pooling == "last":
        return last_real(h, key_mask)
    return masked_mean(h[:, start:], None if key_mask is None else key_mask[:, start:])


class CosineHead(nn.Module):
    """Two-class pair scores ``[0, scale * cos(u, v) + bias]`` (different, same)."""

    def __init__(self, scale: float = 10.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(scale))
        self.bias = nn.Parameter(torch.tensor(0.0))

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        same = self.scale * F.cosine_similarity(u, v, dim=-1) + self.bias  # (P,)
        return torch.stack([torch.zeros_like(same), same], dim=-1)  # (P, 2)


@register_model("encoder_classifier", EncoderClassifierConfig)
class EncoderClassifier(nn.Module):
    """Encoder + pooling + classifier head: ``model(ids, key_mask) -> logits (B, C)`` (``(B, N, C)`` with
    ``pooling="tokens"``) over ``[CLS?][extra global tokens][tokens]``; ``dual=True``: both inputs share the
    weights and :meth:`pair_logits` scores the pooled pair. Under a causal attention CLS sees only itself."""

    def __init__(self, config: EncoderClassifierConfig) -> None:
        super().__init__()
        self.config = config
        self.token_emb = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_emb = PositionEmbedding(config.position, config.d_model, config.max_len)
        self.prefix = PrefixTokens(config.d_model, config.pooling == "cls", config.num_extra_global)
        self.encoder = TransformerEncoder(config)
        self.drop = nn.Dropout(config.dropout)
        head_in = 4 * config.d_model if config.dual else config.d_model
        if config.dual and config.pair_head == "cosine":
            self.head = CosineHead()
        elif config.head_hidden:
            self.head: nn.Module = nn.Sequential(nn.Linear(head_in, config.head_hidden), nn.ReLU(),
                                                 nn.Linear(config.head_hidden, config.num_classes))
        else:
            self.head = nn.Linear(head_in, config.num_classes)

    def encode(self, ids: Tensor, key_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Hidden states ``(B, G + N, D)`` and the extended key mask."""
        x = self.token_emb(ids)  # (B, N, D)
        x, key_mask = self.prefix(x, key_mask)  # (B, G + N, D)
        x = self.drop(self.pos_emb(x))
        return self.encoder(x, key_mask), key_mask

    def embed(self, ids: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Pooled representation ``(B, D)``; ``(B, N, D)`` of the input tokens with ``"tokens"``."""
        h, key_mask = self.encode(ids, key_mask)
        if self.config.pooling == "tokens":
            return h[:, self.prefix.count :]  # (B, N, D): the prefix (extra global tokens) dropped
        return pool(h, self.config.pooling, self.prefix.count, key_mask)

    def forward(
        self,
        ids: Tensor,
        key_mask: Tensor | None = None,
        *,
        pair_ids: Tensor | None = None,
        pair_key_mask: Tensor | None = None,
    ) -> Tensor:
        u = self.embed(ids, key_mask)  # (B, D), or (B, N, D) with pooling="tokens"
        if not self.config.dual:
            if pair_ids is not None:
                raise ValueError("pair_ids: only a dual encoder (dual=True) takes a second input")
            return self.head(u)  # (B, C), or (B, N, C) with pooling="tokens"
        if pair_ids is None:
            raise ValueError("pair_ids: a dual encoder needs the second input")
        return self.pair_logits(u, self.embed(pair_ids, pair_key_mask))  # (B, C)

    def pair_logits(self, u: Tensor, v: Tensor) -> Tensor:
        """Logits ``(P, C)`` of pairs of pooled vectors ``u, v (P, D)`` (a dual encoder's head)."""
        if isinstance(self.head, CosineHead):
            return self.head(u, v)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))

    def stream(self, window: int, update: str = "auto"):
        """A :class:`~models.streaming.StreamingEncoder` over the last ``window`` tokens."""
        return StreamingEncoder(self, window, update=update)
