"""Model configs: frozen dataclasses, named sizes, validation at construction (errors name the field; ``position``
rules: docs/models.md). With a recurrent mixer the self-attention settings are still checked, causal form aside:
``attention_kernel`` and ``num_heads`` still serve an encoder-decoder's cross-attention."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import attn
from attn.validation import invalid, require_choice, require_int

ACTIVATIONS = ("relu", "gelu")
NORMS = ("post", "pre")
POSITIONS = ("auto", "sinusoidal", "learned", "none", "rope")
POOLINGS = ("cls", "mean", "last")  # one vector per sequence (every model kind with a head)
ENCODER_POOLINGS = (*POOLINGS, "tokens")  # "tokens": logits at every position (encoder only)
PAIR_HEADS = ("concat", "cosine")
MIXERS = ("attention", "lstm", "gru")

#: named model sizes (``create_model(kind, size)``) before overrides; kind extras: ``kind_sizes``
SIZES: dict[str, dict[str, Any]] = {
    # well under a second per training step on CPU (tests, the model-step sweep)
    "mini": dict(d_model=32, num_heads=2, num_layers=2, d_ff=64, max_len=256, vocab_size=32),
    "medium": dict(d_model=128, num_heads=4, num_layers=4, d_ff=512, max_len=1024, vocab_size=256),
    # the Long Range Arena's base size (Tay et al. 2021) as we recall it; the decoding benchmark's models
    "lra_base": dict(d_model=256, num_heads=4, num_layers=4, d_ff=1024, max_len=4096, vocab_size=256),
}


@dataclass(frozen=True)
class ModelConfig:
    """Fields every model kind shares: sizes, block style, positions and the attention."""

    vocab_size: int = 32
    d_model: int = 32
    num_heads: int = 2
    num_layers: int = 2
    d_ff: int = 64
    dropout: float = 0.0
    activation: str = "gelu"
    norm: str = "post"  # "post": LayerNorm(x + f(x)) (Vaswani et al. 2017); "pre": x + f(LayerNorm(x))
    max_len: int = 256
    position: str = "auto"
    attention: str = "full"
    attention_params: dict[str, Any] = field(default_factory=dict)
    attention_kernel: str = "auto"
    mixer: str = "attention"  # "lstm" / "gru": a recurrent layer replaces self-attention
    num_kv_heads: int | None = None  # grouped-query key/value heads (1: multi-query); None: num_heads

    #: whether the model's self-attention runs causally (decoders)
    needs_causal: ClassVar[bool] = False
    #: kind-specific extras of a size, by size name
    kind_sizes: ClassVar[dict[str, dict[str, Any]]] = {}

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_params", dict(self.attention_params))
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len"):
            require_int(name, getattr(self, name), minimum=1)
        if self.d_model % self.num_heads:
            raise invalid(
                "d_model", f"must be divisible by num_heads={self.num_heads}; got {self.d_model}"
            )
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        require_int("num_kv_heads", self.num_kv_heads, minimum=1)
        if self.num_heads % self.num_kv_heads:
            raise invalid("num_kv_heads", f"must divide num_heads={self.num_heads} (each key head serves "
                                          f"num_heads / num_kv_heads query heads); got {self.num_kv_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise invalid("dropout", f"must be in [0, 1); got {self.dropout!r}")
        require_choice("activation", self.activation, ACTIVATIONS)
        require_choice("norm", self.norm, NORMS)
        require_choice("position", self.position, POSITIONS)
        require_choice("mixer", self.mixer, MIXERS)
        if self.recurrent and not self.needs_causal and self.d_model % 2:
            raise invalid(
                "d_model",
                f"must be even with mixer={self.mixer!r} (a bidirectional encoder layer has "
                f"d_model // 2 units per direction); got {self.d_model}",
            )
        require_choice("attention", self.attention, attn.list_attention())
        kernels = ("auto", *attn.attention_info(self.attention).kernels)
        require_choice("attention_kernel", self.attention_kernel, kernels)
        # a self-attention that a recurrent mixer replaces is never run, so needs no causal form
        causal = self.needs_causal and not self.recurrent
        self._check_attention(self.attention, self.attention_params, "attention", causal=causal)
        if self.num_kv_heads < self.num_heads and not attn.attention_info(self.attention).supports_gqa:
            raise invalid("num_kv_heads", f"must equal num_heads={self.num_heads} with attention "
                                          f"{self.attention!r}, which does not support grouped-query "
                                          f"attention (supports_gqa=False); got {self.num_kv_heads}")
        has_bias = self.attention == "relative" or self.attention_params.get("position_bias")
        if self.position == "auto":
            object.__setattr__(self, "position", "none" if has_bias else self.default_position())
        elif has_bias and self.position != "none":
            raise invalid(
                "position",
                f"must be 'none' (or 'auto') when the attention carries a relative position bias "
                f"(one position scheme per model: RoPE and a bias are two); got {self.position!r}",
            )
        if self.position == "rope":
            if self.recurrent:
                raise invalid(
                    "position",
                    f"'rope' rotates self-attention queries and keys, and mixer={self.mixer!r} has "
                    "no self-attention: choose 'sinusoidal', 'learned', 'none' or 'auto'",
                )
            if self.head_dim % 2:
                raise invalid(
                    "d_model",
                    f"position='rope' needs an even head dim d_model / num_heads (RoPE turns pairs "
                    f"of channels); got {self.d_model} / {self.num_heads} = {self.head_dim}",
                )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def recurrent(self) -> bool:
        """Whether a recurrent layer (``mixer`` "lstm" / "gru") replaces the self-attention."""
        return self.mixer != "attention"

    def default_position(self) -> str:
        return "sinusoidal"

    def _check_attention(
        self, name: str, params: dict[str, Any], field_name: str, causal: bool | None = None
    ) -> None:
        """Check ``name(**params)`` (no module built) and its causal form where needed; errors name ``field_name``."""
        causal = self.needs_causal if causal is None else causal
        try:
            attn.check_attention_params(
                name, num_heads=self.num_heads, head_dim=self.head_dim, kernel=self.attention_kernel, **params
            )
        except (ValueError, TypeError) as err:
            raise invalid(field_name, f"cannot build {name!r}: {err}") from err
        if causal and not attn.attention_info(name).supports_causal:
            raise invalid(
                field_name,
                f"{name!r} has no causal form, so it cannot run in a decoder "
                "(choose a variant with supports_causal=True)",
            )


@dataclass(frozen=True)
class EncoderClassifierConfig(ModelConfig):
    """BERT-style encoder with a classification head; ``dual=True`` encodes two inputs (retrieval)."""

    num_classes: int = 2
    # "cls": learned CLS at position 0; "mean": over real tokens; "last": the last real token;
    # "tokens": logits at every real token (B, N, C), e.g. per-position labels (MQAR)
    pooling: str = "cls"
    num_extra_global: int = 0  # learned global tokens prepended after CLS (for global_tokens)
    dual: bool = False
    head_hidden: int = 0  # 0: a linear head; > 0: an MLP head with this hidden width (LRA's dual head)
    # dual only: "concat" classifies [u, v, u*v, u-v] (LRA); "cosine": learned scale and bias on cos(u, v)
    pair_head: str = "concat"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("num_classes", self.num_classes, minimum=1)
        require_int("head_hidden", self.head_hidden, minimum=0)
        require_choice("pair_head", self.pair_head, PAIR_HEADS)
        if self.pair_head == "cosine" and self.dual and self.num_classes != 2:
            raise invalid("pair_head", "'cosine' scores same / different: it needs num_classes=2, "
                                     f"got {self.num_classes}")
        require_choice("pooling", self.pooling, ENCODER_POOLINGS)
        if self.pooling == "tokens" and self.dual:
            raise invalid("pooling", "'tokens' gives logits per position, but a dual encoder "
                                     "scores one pooled vector per input: use 'cls', 'mean' or 'last'")
        require_int("num_extra_global", self.num_extra_global, minimum=0)


@dataclass(frozen=True)
class DecoderLMConfig(ModelConfig):
    """GPT-style decoder language model (causal self-attention, tied output embedding)."""

    tie_embeddings: bool = True
    needs_causal: ClassVar[bool] = True


@dataclass(frozen=True)
class EncoderDecoderConfig(ModelConfig):
    """Translation-style encoder-decoder; ``attention`` also serves the decoder unless ``decoder_attention``."""

    num_decoder_layers: int | None = None  # None: num_layers
    decoder_attention: str | None = None  # None: same as attention (and attention_params)
    decoder_attention_params: dict[str, Any] = field(default_factory=dict)
    cross_attention: str = "full"
    bos_id: int = 1
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoder_attention_params", dict(self.decoder_attention_params))
        if self.num_decoder_layers is not None:
            require_int("num_decoder_layers", self.num_decoder_layers, minimum=1)
        if self.decoder_attention is None and self.decoder_attention_params:
            raise invalid(
                "decoder_attention_params", "given without decoder_attention (set both, or neither)"
            )
        if not 0 <= self.bos_id < self.vocab_size:
            raise invalid("bos_id", f"must be in [0, vocab_size={self.vocab_size}); got {self.bos_id}")
        super().__post_init__()
        name, params = self.decoder_self_attention
        field_name = "attention" if self.decoder_attention is None else "decoder_attention"
        require_choice(field_name, name, attn.list_attention())
        self._check_attention(name, params, field_name, causal=not self.recurrent)
        self._check_attention(self.cross_attention, {}, "cross_attention", causal=False)

    @property
    def decoder_self_attention(self) -> tuple[str, dict[str, Any]]:
        if self.decoder_attention is None:
            return self.attention, self.attention_params
        return self.decoder_attention, self.decoder_attention_params

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers


@dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """Vision Transformer: patch embedding, learned 1D positions, CLS token, classifier."""

    image_size: int = 16
    patch_size: int = 4
    in_channels: int = 3
    num_classes: int = 10
    pooling: str = "cls"
    num_extra_global: int = 0

    kind_sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "mini": dict(image_size=16, patch_size=4, in_channels=3),
        "medium": dict(image_size=32, patch_size=4, in_channels=3, max_len=256),
        # LRA "Image": 32x32 grey CIFAR-10 as a pixel sequence (patch 1 -> 1024 tokens)
        "lra_base": dict(image_size=32, patch_size=1, in_channels=1, max_len=1088),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("image_size", "patch_size", "in_channels", "num_classes"):
            require_int(name, getattr(self, name), minimum=1)
        require_int("num_extra_global", self.num_extra_global, minimum=0)
        require_choice("pooling", self.pooling, POOLINGS)
        if self.image_size % self.patch_size:
            raise invalid(
                "patch_size",
                f"must divide image_size={self.image_size}; got {self.patch_size}",
            )
        if self.num_tokens > self.max_len and self.position == "learned":
            raise invalid(
                "max_len",
                f"must be >= the {self.num_tokens} tokens of a {self.image_size}px image in "
                f"{self.patch_size}px patches (+ CLS and global tokens); got {self.max_len}",
            )

    def default_position(self) -> str:
        return "learned"

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        return self.num_patches + (self.pooling == "cls") + self.num_extra_global


def build_config(config_cls: type[ModelConfig], size: str, **overrides: Any) -> ModelConfig:
    """``config_cls`` filled from model size ``size``, then ``overrides`` (unknown fields: ValueError)."""
    if size not in SIZES:
        raise ValueError(f"size: unknown model size {size!r}; sizes are {', '.join(SIZES)}")
    names = {f.name for f in fields(config_cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a field of {config_cls.__name__}; fields are {', '.join(sorted(names))}"
        )
    values = {**SIZES[size], **config_cls.kind_sizes.get(size, {}), **overrides}
    return config_cls(**{k: v for k, v in values.items() if k in names})
