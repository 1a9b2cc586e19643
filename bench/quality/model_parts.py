"""Which attention serves which part of a task's model, as the model kind places it
(:class:`models.registration.Placement`; docs/quality.md, "Training and evaluation")."""

from __future__ import annotations

from typing import Any

from bench.engine.labels import variant_label as label  # the one labelling of sweeps and grids
from models.registration import Placement
from models.registry import list_models, model_info


def model_parts(model_kind: str, variant: str, params: dict[str, Any],
                causal_self_attention: bool, mixer: str = "attention") -> Placement:
    """The attention of every part of ``model_kind`` for ``variant(params)``; with a recurrent ``mixer`` (model
    setting ``mixer: lstm``) no part self-attends."""
    place = model_info(model_kind, "model_kind").place
    return place(variant, params, label(variant, params), causal=causal_self_attention,
                 mixer=mixer)


def always_causal(model_kind: str) -> bool:
    """Whether every self-attention of a ``model_kind`` model runs causally (``causal`` is ``full`` there)."""
    return model_kind in list_models() and model_info(model_kind).config_cls.needs_causal
