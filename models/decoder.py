"""GPT-style decoder language model with a KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from models.attention import KVCache
from models.blocks import make_blocks
from models.config import DecoderLMConfig
from models.embeddings import PositionEmbedding, TokenEmbedding
from models.generation import GenerationMixin
from models.recurrent import RecurrentCache
from models.registration import place_causal_self_attention, register_model


@dataclass
class DecoderCache:
    """Per-layer self-attention caches (recurrent state caches with a recurrent ``mixer``),
    cross-attention caches and the tokens seen so far."""

    layers: list[KVCache | RecurrentCache]
    cross: list[KVCache] = field(default_factory=list)
    length: int = 0  # absolute position of the next token

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows of every layer's cache (beam search)."""
        for cache in (*self.layers, *self.cross):
            cache.reorder(index)


@register_model("decoder_lm", DecoderLMConfig, place=place_causal_self_attention)
class DecoderLM(GenerationMixin, nn.Module):
    """Causal LM: ``model(ids, key_mask=None) -> logits (B, N, V)``; ``generate`` decodes."""

    def __init__(self, config: DecoderLMConfig) -> None:
        super().__init__()
        self.config = config
        self.token_emb = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_emb = PositionEmbedding(config.position, config.d_model, config.max_len)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = make_blocks(
            config, config.num_layers, config.attention, config.attention_params, causal=True
        )
        self.norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_emb.weight

    def new_cache(self) -> DecoderCache:
        return DecoderCache([block.new_cache() for block in self.blocks])

    def forward(
        self, ids: Tensor, key_mask: Tensor | None = None, *, cache: DecoderCache | None = None
    ) -> Tensor:
        """``ids (B, N)`` -> ``logits (B, N, V)``; with ``cache``, ids are the new tokens only."""
        offset = 0 if cache is None else cache.length
        x = self.drop(self.pos_emb(self.token_emb(ids), offset))  # (B, N, D)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            x = block(x, causal=True, key_mask=key_mask, cache=layer_cache)
        if cache is not None:
            cache.length += ids.shape[1]
        return self.lm_head(self.norm(x))  # (B, N, V)

    def start_decoding(self, ids: Tensor, use_cache: bool = True, **unused) -> tuple[_LMSession, Tensor]:
        if unused:
            raise ValueError(f"{next(iter(unused))}: not an argument of decoder_lm.generate")
        return _LMSession(self, use_cache), ids


class _LMSession:
    """Next-token logits for a growing token sequence, through the KV cache or not."""

    def __init__(self, model: DecoderLM, use_cache: bool) -> None:
        self.model = model
        self.cache = model.new_cache() if use_cache else None

    @torch.no_grad()
    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (B, T)`` (the whole sequence so far) -> logits of token T+1 ``(B, V)``."""
        if self.cache is None:
            return self.model(tokens)[:, -1]
        return self.model(tokens[:, self.cache.length :], cache=self.cache)[:, -1]

    def reorder(self, index: Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(index)
