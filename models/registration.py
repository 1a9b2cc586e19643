"""The table of model kinds and the decorator that fills it (:func:`register_model`).

The bottom of the model layers: model modules import this to register themselves, and
:mod:`models.registry` imports the model modules, so imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from torch import nn

from models.config import ModelConfig

T = TypeVar("T")


@dataclass(frozen=True)
class ModelEntry:
    """A registered kind: its builder (``builder(config)``) and its config class."""

    builder: Callable[[ModelConfig], nn.Module]
    config_cls: type[ModelConfig]


MODELS: dict[str, ModelEntry] = {}


def register_model(kind: str, config_cls: type[ModelConfig]) -> Callable[[T], T]:
    """Decorator registering a model class built as ``cls(config)`` under ``kind``."""

    def decorator(cls: T) -> T:
        if kind in MODELS and MODELS[kind].builder is not cls:
            raise ValueError(f"register_model: kind {kind!r} is already registered")
        MODELS[kind] = ModelEntry(cls, config_cls)  # type: ignore[arg-type]
        return cls

    return decorator
