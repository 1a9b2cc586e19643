"""GPT-style decoder language model with a KV cache; ragged (left-padded) prompts in one batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attn.documents import Documents, check_document_ids
from attn.validation import invalid
from models.attention import KVCache, StateCache, pattern_shift_reason
from models.blocks import make_blocks
from models.config import DecoderLMConfig
from models.embeddings import PositionEmbedding, TokenEmbedding, first_real, token_positions
from models.generation import GenerationMixin, check_left_padded
from models.recurrent import RecurrentCache
from models.registration import place_causal_self_attention, register_model


@dataclass
class DecoderCache:
    """Per-layer self- and cross-attention caches, the tokens seen, and each row's first real column."""

    layers: list[KVCache | StateCache | RecurrentCache]
    cross: list[KVCache] = field(default_factory=list)
    length: int = 0  # column of the next token (its absolute position in a row without padding)
    start: Tensor | None = None  # (B,) each row's first real column; None: 0 for every row

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search)."""
        for cache in (*self.layers, *self.cross):
            cache.reorder(index)
        if self.start is not None:
            self.start = self.start.index_select(0, index)

    def positions(self, length: int, key_mask: Tensor | None, device: torch.device) -> Tensor:
        """Absolute positions ``(B|1, N)`` of the next tokens; a first call's ``key_mask`` fixes each row's start."""
        if self.length == 0 and key_mask is not None:
            self.start = _starts(key_mask)
        return token_positions(length, self.length, self.start, device)


def _starts(key_mask: Tensor | None) -> Tensor | None:
    """Each row's first real column ``(B,)``, or None when every row starts at column 0."""
    start = None if key_mask is None else first_real(key_mask)  # (B,)
    return start if start is not None and bool(start.any()) else None


def row_positions(length: int, key_mask: Tensor | None, cache: DecoderCache | None,
                  device: torch.device) -> Tensor:
    """Absolute positions ``(B|1, N)`` of a decoder call's tokens, each row counted from its first real token."""
    if cache is not None:
        return cache.positions(length, key_mask, device)
    return token_positions(length, 0, _starts(key_mask), device)


def document_positions(ids: Tensor, document_ids: Tensor) -> Tensor:
    """Positions ``(B, N)`` from each token's document start; ``document_ids`` are validated here."""
    check_document_ids("decoder_lm", document_ids, batch=ids.shape[0], q_len=ids.shape[1],
                       k_len=ids.shape[1], device=ids.device)
    starts = Documents.from_ids(document_ids).starts  # (B, N)
    return torch.arange(ids.shape[1], device=ids.device) - starts


@register_model("decoder_lm", DecoderLMConfig, place=place_causal_self_attention)
class DecoderLM(GenerationMixin, nn.Module):
    """Causal LM: ``model(ids, key_mask=None) -> logits (B, N, V)``; ``generate`` decodes (left-padded prompts:
    docs/models.md)."""

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
        self, ids: Tensor, key_mask: Tensor | None = None, *, cache: DecoderCache | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """``ids (B, N)`` -> ``logits (B, N, V)``; with ``cache``, ids are the new tokens only and ``key_mask``
        masks them for every later call. ``document_ids (B, N)``: packed rows, without cache or ``key_mask``
        (docs/models.md, "Packed rows")."""
        if document_ids is not None and (cache is not None or key_mask is not None):
            raise ValueError("document_ids: packed rows take no cache and no key_mask (allowed: "
                             "document_ids alone, in a full forward)")
        positions = row_positions(ids.shape[1], key_mask, cache, ids.device)  # (B|1, N)
        if document_ids is not None:
            positions = document_positions(ids, document_ids)  # (B, N)
        x = self.drop(self.pos_emb(self.token_emb(ids), positions=positions))  # (B, N, D)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            x = block(x, causal=True, key_mask=key_mask, cache=layer_cache, positions=positions,
                      document_ids=document_ids)
        if cache is not None:
            cache.length += ids.shape[1]
        return self.lm_head(self.norm(x))  # (B, N, V)

    def start_decoding(
        self, ids: Tensor, use_cache: bool = True, key_mask: Tensor | None = None, **unused
    ) -> tuple[_LMSession, Tensor]:
        """A decoding session over prompts ``ids (B, T)``; ``key_mask`` for left-padded prompts."""
        if unused:
            raise ValueError(f"{next(iter(unused))}: not an argument of decoder_lm.generate")
        if key_mask is not None:
            check_left_padded(key_mask, ids)
            if self.config.recurrent:
                raise invalid("key_mask", f"ragged prompts need self-attention blocks; this model has "
                                          f"mixer={self.config.mixer!r} (allowed: mixer='attention')")
            reason = pattern_shift_reason(self.blocks[0].self_attn.attention)
            if reason is not None:
                raise invalid("key_mask", f"ragged prompts are left-padded, which moves each row by its "
                                          f"padding, and attention={self.config.attention!r} cannot be "
                                          f"moved: {reason} (allowed: a pattern of j - i only, e.g. "
                                          "full, causal, sliding_window, dilated, relative)")
            if bool(key_mask.all()):
                key_mask = None
        return _LMSession(self, use_cache, key_mask), ids


class _LMSession:
    """Next-token logits for a growing sequence, through the KV cache or not, masking prompt padding."""

    def __init__(self, model: DecoderLM, use_cache: bool, key_mask: Tensor | None = None) -> None:
        self.model = model
        self.cache = model.new_cache() if use_cache else None
        self.key_mask = key_mask  # (B, T) of the prompt; None: no padding

    @torch.no_grad()
    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (B, T)``, the whole sequence so far -> next-token logits ``(B, V)``."""
        if self.cache is None:
            mask = self.key_mask
            if mask is not None:  # the prompt's padding, then every generated token is real
                new = tokens.shape[1] - mask.shape[1]
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], new)], dim=1)  # (B, T)
            return self.model(tokens, mask)[:, -1]
        if self.cache.length == 0:  # the prompt: its mask goes into the cache
            return self.model(tokens, self.key_mask, cache=self.cache)[:, -1]
        return self.model(tokens[:, self.cache.length :], cache=self.cache)[:, -1]

    def reorder(self, index: Tensor) -> None:
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
