"""The model registry, the top of the model layers: it imports the built-in kinds, each registering itself with
:func:`models.registration.register_model` (docs/extending.md, "A model kind")."""

from __future__ import annotations

import fnmatch
from typing import Any

from torch import nn

from models import decoder, encoder, encoder_decoder, vit, vivit  # noqa: F401  (register the built-in kinds)
from models.config import ModelConfig, build_config
from models.registration import MODELS, ModelEntry, register_model, unregister_model

__all__ = ["create_model", "list_models", "model_config", "model_info", "register_model",
           "unregister_model"]


def list_models(pattern: str = "*") -> list[str]:
    """Registered model kinds matching the glob ``pattern``, sorted."""
    return sorted(k for k in MODELS if fnmatch.fnmatch(k, pattern))


def model_info(kind: str, subject: str = "kind") -> ModelEntry:
    """The registry entry of ``kind`` (builder, config class, placement); ``ValueError`` naming ``subject``."""
    if kind not in MODELS:
        raise ValueError(f"{subject}: unknown model kind {kind!r}; kinds are {list_models()}")
    return MODELS[kind]


def model_config(
    kind: str,
    size: str = "mini",
    attention: str = "full",
    attention_params: dict[str, Any] | None = None,
    **overrides: Any,
) -> ModelConfig:
    """The validated config ``create_model`` would build (``ValueError`` names a bad field)."""
    return build_config(
        model_info(kind).config_cls,
        size,
        attention=attention,
        attention_params=dict(attention_params or {}),
        **overrides,
    )


def create_model(
    kind: str,
    size: str = "mini",
    attention: str = "full",
    attention_params: dict[str, Any] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build model ``kind`` of size ``size`` (:data:`models.config.SIZES`) with the attention given by name."""
    config = model_config(kind, size, attention, attention_params, **overrides)
    return MODELS[kind].builder(config)
