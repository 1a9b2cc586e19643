"""Which attention serves which part of a task's model, said out loud.

A variant that cannot serve a part (Nystrom is not causal, so it cannot be a decoder's
self-attention) is never silently replaced: a decoder-only model is ``unsupported`` with the
reason, and an encoder-decoder keeps the variant in its encoder and uses causal full
attention in its decoder, which the row records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attn import attention_info
from bench.engine.labels import variant_label

#: the decoder self-attention used when the variant has no causal form
DECODER_FALLBACK = "causal"
CROSS_ATTENTION = "full"


@dataclass(frozen=True)
class ModelParts:
    """Model keyword arguments for the attention, and a description of every part."""

    kwargs: dict[str, Any]
    description: str
    unsupported: str | None = None  # the reason the task cannot run this variant at all


def label(variant: str, params: dict[str, Any], overrides: dict[str, Any] | None = None) -> str:
    """``name(k=v, ...)`` naming every pattern parameter, the variant's defaults included,
    then any settings overrides in brackets (:func:`bench.engine.labels.variant_label`, the one
    labelling function of speed sweeps and quality grids)."""
    return variant_label(variant, params, overrides)


def model_parts(model_kind: str, variant: str, params: dict[str, Any],
                causal_self_attention: bool, mixer: str = "attention") -> ModelParts:
    """The attention of every part of ``model_kind`` for ``variant(params)``; with a recurrent
    ``mixer`` (model setting ``mixer: lstm``) no part self-attends, and an encoder-decoder
    keeps only its cross-attention."""
    name = label(variant, params)
    causal_ok = attention_info(variant).supports_causal
    base = {"attention": variant, "attention_params": params}
    if mixer != "attention":
        if model_kind == "encoder_decoder":
            return ModelParts({**base, "cross_attention": CROSS_ATTENTION},
                              f"no self-attention ({mixer} layers); cross-attention={CROSS_ATTENTION}")
        return ModelParts(base, f"no attention ({mixer} layers)")
    if model_kind in ("encoder_classifier", "vit"):
        return ModelParts(base, f"self-attention={name}")
    if model_kind == "decoder_lm":
        if causal_self_attention and not causal_ok:
            return ModelParts(base, f"self-attention={name}", unsupported=(
                f"{variant} has no causal form, so it cannot be a decoder's self-attention"))
        return ModelParts(base, f"causal self-attention={name}")
    if model_kind == "encoder_decoder":
        parts = {**base, "cross_attention": CROSS_ATTENTION}
        decoder = name
        if not causal_ok:
            parts.update(decoder_attention=DECODER_FALLBACK, decoder_attention_params={})
            decoder = f"{DECODER_FALLBACK} ({variant} has no causal form)"
        return ModelParts(parts, f"encoder={name}; decoder self-attention={decoder}; "
                                 f"cross-attention={CROSS_ATTENTION}")
    raise ValueError(f"model_kind: unknown model kind {model_kind!r}; kinds are "
                     "['encoder_classifier', 'vit', 'decoder_lm', 'encoder_decoder']")
