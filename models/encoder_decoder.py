"""Translation-style encoder-decoder: encoder self-attention, causal decoder, cross-attention."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import attn
from models.blocks import make_blocks
from models.config import EncoderDecoderConfig
from models.decoder import DecoderCache, row_positions
from models.embeddings import PositionEmbedding, TokenEmbedding
from models.encoder import TransformerEncoder
from models.generation import GenerationMixin
from models.registration import Placement, register_model

#: the decoder self-attention used when the variant has no causal form
DECODER_FALLBACK = "causal"
CROSS_ATTENTION = "full"


def place_encoder_decoder(variant: str, params: dict[str, Any], label: str, *, causal: bool,
                          mixer: str) -> Placement:
    """The variant in the encoder and the decoder's self-attention (:data:`DECODER_FALLBACK` without a causal
    form, said in the description), full cross-attention."""
    parts = {"attention": variant, "attention_params": params, "cross_attention": CROSS_ATTENTION}
    if mixer != "attention":
        return Placement(parts, f"no self-attention ({mixer} layers); "
                                f"cross-attention={CROSS_ATTENTION}")
    decoder = label
    if not attn.attention_info(variant).supports_causal:
        parts.update(decoder_attention=DECODER_FALLBACK, decoder_attention_params={})
        decoder = f"{DECODER_FALLBACK} ({variant} has no causal form)"
    return Placement(parts, f"encoder={label}; decoder self-attention={decoder}; "
                            f"cross-attention={CROSS_ATTENTION}")


@register_model("encoder_decoder", EncoderDecoderConfig, place=place_encoder_decoder)
class EncoderDecoder(GenerationMixin, nn.Module):
    """``model(src, tgt, src_key_mask=None, tgt_key_mask=None) -> logits (B, Nt, V)``; ``generate(src, ...)`` starts
    every target with ``bos_id``. With a recurrent ``mixer``: Bahdanau et al. 2015's RNN encoder-decoder."""

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.token_emb = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_emb = PositionEmbedding(config.position, config.d_model, config.max_len)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = TransformerEncoder(config)
        name, params = config.decoder_self_attention
        self.decoder_blocks = make_blocks(
            config, config.decoder_layers, name, params, cross_attention=config.cross_attention,
            causal=True,
        )
        self.decoder_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_emb.weight

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None) -> Tensor:
        x = self.drop(self.pos_emb(self.token_emb(src)))
        return self.encoder(x, src_key_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_key_mask: Tensor | None = None,
        tgt_key_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Target logits ``(B, Nt, V)``; with ``cache``, ``tgt`` holds only the new tokens."""
        positions = row_positions(tgt.shape[1], tgt_key_mask, cache, tgt.device)  # (B|1, Nt)
        x = self.drop(self.pos_emb(self.token_emb(tgt), positions=positions))  # (B, Nt, D)
        for i, block in enumerate(self.decoder_blocks):
            x = block(
                x,
                causal=True,
                key_mask=tgt_key_mask,
                context=memory,
                context_mask=src_key_mask,
                cache=None if cache is None else cache.layers[i],
                cross_cache=None if cache is None else cache.cross[i],
                positions=positions,
            )
        if cache is not None:
            cache.length += tgt.shape[1]
        return self.lm_head(self.decoder_norm(x))

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_key_mask: Tensor | None = None,
        tgt_key_mask: Tensor | None = None,
    ) -> Tensor:
        memory = self.encode(src, src_key_mask)  # (B, Ns, D)
        return self.decode(tgt, memory, src_key_mask, tgt_key_mask)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(
            [b.new_cache() for b in self.decoder_blocks],
            [b.new_cross_cache() for b in self.decoder_blocks],
        )

    def start_decoding(
        self, src: Tensor, use_cache: bool = True, src_key_mask: Tensor | None = None
    ) -> tuple[_Seq2SeqSession, Tensor]:
        session = _Seq2SeqSession(self, self.encode(src, src_key_mask), src_key_mask, use_cache)
        prefix = torch.full((src.shape[0], 1), self.config.bos_id, dtype=torch.long, device=src.device)
        return session, prefix


class _Seq2SeqSession:
    def __init__(
        self, model: EncoderDecoder, memory: Tensor, src_key_mask: Tensor | None, use_cache: bool
    ) -> None:
        self.model = model
        self.memory = memory  # (B, Ns, D)
        self.src_key_mask = src_key_mask
        self.cache = model.new_cache() if use_cache else None

    @torch.no_grad()
    def next_logits(self, tokens: Tensor) -> Tensor:
        if self.cache is None:
            return self.model.decode(tokens, self.memory, self.src_key_mask)[:, -1]
        new = tokens[:, self.cache.length :]
        return self.model.decode(new, self.memory, self.src_key_mask, cache=self.cache)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.memory = self.memory.index_select(0, index)
        if self.src_key_mask is not None:
            self.src_key_mask = self.src_key_mask.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
