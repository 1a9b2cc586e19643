"""Shared transformer models that take any registered attention by name (docs/models.md): ``create_model(kind,
size="mini", attention="full", attention_params={}, **overrides)``, ``list_models()``; adding a kind:
docs/extending.md.

    >>> lm = create_model("decoder_lm", attention="sliding_window", attention_params={"window": 64})
    >>> out = lm.generate(ids, 32, strategy="beam", beam_width=4, eos_id=2)
"""

from models.attention import KVCache, MultiHeadAttention, RotaryEmbedding, cache_policy
from models.blocks import FeedForward, TransformerBlock
from models.config import (
    SIZES,
    DecoderLMConfig,
    EncoderClassifierConfig,
    EncoderDecoderConfig,
    ModelConfig,
    ViTConfig,
)
from models.decoder import DecoderCache, DecoderLM
from models.embeddings import PatchEmbedding, PositionEmbedding, PrefixTokens, TokenEmbedding
from models.encoder import EncoderClassifier, TransformerEncoder
from models.encoder_decoder import EncoderDecoder
from models.generation import beam_search, greedy_search, left_pad, length_penalty, sample
from models.registration import Placement
from models.registry import create_model, list_models, model_config, model_info, register_model, unregister_model
from models.streaming import StreamingEncoder
from models.vit import ViT

__all__ = [
    "SIZES",
    "DecoderCache",
    "DecoderLM",
    "DecoderLMConfig",
    "EncoderClassifier",
    "EncoderClassifierConfig",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "FeedForward",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "PatchEmbedding",
    "Placement",
    "PositionEmbedding",
    "PrefixTokens",
    "RotaryEmbedding",
    "StreamingEncoder",
    "TokenEmbedding",
    "TransformerBlock",
    "TransformerEncoder",
    "ViT",
    "ViTConfig",
    "beam_search",
    "cache_policy",
    "create_model",
    "greedy_search",
    "left_pad",
    "length_penalty",
    "list_models",
    "model_config",
    "model_info",
    "register_model",
    "sample",
    "unregister_model",
]
