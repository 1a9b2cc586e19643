"""Which attention serves which part of a task's model, said out loud.

How a variant goes into a model is the model kind's own declaration
(:class:`models.registration.Placement`, given where the kind is registered): a variant that
cannot serve a part (Nystrom is not causal, so it cannot be a decoder's self-attention) is
never silently replaced: a decoder-only model is ``unsupported`` with the reason, and an
encoder-decoder keeps the variant in its encoder and uses causal full attention in its
decoder, which the row records.
"""

from __future__ import annotations

from typing import Any

from bench.engine.labels import variant_label
from models.registration import Placement
from models.registry import list_models, model_info

#: what :func:`model_parts` returns (the model kwargs, the parts described, unsupported)
ModelParts = Placement


def label(variant: str, params: dict[str, Any], overrides: dict[str, Any] | None = None) -> str:
    """``name(k=v, ...)`` naming every pattern parameter, the variant's defaults included,
    then any settings overrides in brackets (:func:`bench.engine.labels.variant_label`, the one
    labelling function of speed sweeps and quality grids)."""
    return variant_label(variant, params, overrides)


def model_parts(model_kind: str, variant: str, params: dict[str, Any],
                causal_self_attention: bool, mixer: str = "attention") -> Placement:
    """The attention of every part of ``model_kind`` for ``variant(params)``, as the kind
    places it; with a recurrent ``mixer`` (model setting ``mixer: lstm``) no part
    self-attends."""
    place = model_info(model_kind, "model_kind").place
    return place(variant, params, label(variant, params), causal=causal_self_attention,
                 mixer=mixer)


def always_causal(model_kind: str) -> bool:
    """Whether every self-attention of a ``model_kind`` model runs causally (a decoder: its
    config's ``needs_causal``), so that ``causal`` and ``full`` are one model there."""
    return model_kind in list_models() and model_info(model_kind).config_cls.needs_causal
