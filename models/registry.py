"""The model registry: ``register_model`` / ``create_model`` / ``list_models``, like attn's."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from models.config import ModelConfig, build_config

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry:
    builder: Callable[[ModelConfig], nn.Module]
    config_cls: type[ModelConfig]


_MODELS: dict[str, _Entry] = {}


def register_model(kind: str, config_cls: type[ModelConfig]) -> Callable[[T], T]:
    """Decorator registering a model class built as ``cls(config)`` under ``kind``."""

    def decorator(cls: T) -> T:
        if kind in _MODELS and _MODELS[kind].builder is not cls:
            raise ValueError(f"register_model: kind {kind!r} is already registered")
        _MODELS[kind] = _Entry(cls, config_cls)  # type: ignore[arg-type]
        return cls

    return decorator


def _ensure_loaded() -> None:
    import models.decoder
    import models.encoder
    import models.encoder_decoder
    import models.vit  # noqa: F401


def list_models(pattern: str = "*") -> list[str]:
    """Registered model kinds matching the glob ``pattern``, sorted."""
    _ensure_loaded()
    return sorted(k for k in _MODELS if fnmatch.fnmatch(k, pattern))


def model_config(
    kind: str,
    preset: str = "tiny",
    attention: str = "full",
    attention_params: dict[str, Any] | None = None,
    **overrides: Any,
) -> ModelConfig:
    """The validated config ``create_model`` would build (``ValueError`` names a bad field)."""
    _ensure_loaded()
    if kind not in _MODELS:
        raise ValueError(f"kind: unknown model kind {kind!r}; kinds are {', '.join(sorted(_MODELS))}")
    return build_config(
        _MODELS[kind].config_cls,
        preset,
        attention=attention,
        attention_params=dict(attention_params or {}),
        **overrides,
    )


def create_model(
    kind: str,
    preset: str = "tiny",
    attention: str = "full",
    attention_params: dict[str, Any] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build model ``kind`` from ``preset`` with the attention given by name and params."""
    config = model_config(kind, preset, attention, attention_params, **overrides)
    return _MODELS[kind].builder(config)
