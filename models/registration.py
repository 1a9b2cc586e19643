"""The table of model kinds and :func:`register_model` (model modules import it to register themselves), and the
two placements most kinds share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch import nn

import attn
from attn.table import Table, source_of
from models.config import ModelConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Placement:
    """A variant placed into a model: its keyword arguments, every part described, and why the kind cannot
    take it (``None``: it can). A part is never silently given another attention."""

    kwargs: dict[str, Any]
    description: str
    unsupported: str | None = None


class Place(Protocol):
    """How a kind places ``variant(params)`` (shown as ``label``) for a task (``causal``) and ``mixer``."""

    def __call__(self, variant: str, params: dict[str, Any], label: str, *, causal: bool,
                 mixer: str) -> Placement: ...


def place_self_attention(variant: str, params: dict[str, Any], label: str, *, causal: bool,
                         mixer: str) -> Placement:
    """The variant as every block's self-attention (an encoder, a ViT)."""
    base = {"attention": variant, "attention_params": params}
    if mixer != "attention":
        return Placement(base, f"no attention ({mixer} layers)")
    return Placement(base, f"self-attention={label}")


def place_causal_self_attention(variant: str, params: dict[str, Any], label: str, *,
                                causal: bool, mixer: str) -> Placement:
    """The variant as every block's causal self-attention (unsupported without a causal form)."""
    base = {"attention": variant, "attention_params": params}
    if mixer != "attention":
        return Placement(base, f"no attention ({mixer} layers)")
    if causal and not attn.attention_info(variant).supports_causal:
        return Placement(base, f"self-attention={label}", unsupported=(
            f"{variant} has no causal form, so it cannot be a decoder's self-attention"))
    return Placement(base, f"causal self-attention={label}")


@dataclass(frozen=True)
class ModelEntry:
    """A registered kind: its builder (``builder(config)``), config class and placement."""

    builder: Callable[[ModelConfig], nn.Module]
    config_cls: type[ModelConfig]
    place: Place = place_self_attention


MODELS: Table[ModelEntry] = Table("register_model", arg="kind")


def register_model(kind: str, config_cls: type[ModelConfig], *, place: Place = place_self_attention,
                   overwrite: bool = False) -> Callable[[T], T]:
    """Decorator registering a model class built as ``cls(config)`` under ``kind``, with its placement."""

    def decorator(cls: T) -> T:
        MODELS.add(kind, ModelEntry(cls, config_cls, place), source=source_of(cls),  # type: ignore[arg-type]
                   overwrite=overwrite)
        return cls

    return decorator


def unregister_model(kind: str) -> None:
    """Remove model kind ``kind``; no error if it is absent."""
    MODELS.remove(kind)
