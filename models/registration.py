"""The table of model kinds (an :class:`attn.table.Table`) and the decorator that fills it
(:func:`register_model`): a kind's builder, config class and :class:`Placement` of a variant.
The two placements most kinds share are here; a kind with other parts writes its own beside
its class (``models/encoder_decoder.py``).

The bottom of the model layers above the configs: model modules import this to register
themselves, and :mod:`models.registry` imports the model modules, so imports run one way.
"""

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
    """A variant placed into a model: the model keyword arguments that put it there, every
    part described (``self-attention=sliding_window(window=16)``), and the reason the kind
    cannot take the variant at all (``None``: it can). A part a variant cannot serve is never
    silently given another attention: the kind either says so here or refuses."""

    kwargs: dict[str, Any]
    description: str
    unsupported: str | None = None


class Place(Protocol):
    """How a kind places ``variant(params)`` (shown as ``label``); ``causal``: the task needs
    causal self-attention; ``mixer``: ``attention``, or a recurrent layer (``lstm``, ``gru``)
    in place of every self-attention."""

    def __call__(self, variant: str, params: dict[str, Any], label: str, *, causal: bool,
                 mixer: str) -> Placement: ...


def place_self_attention(variant: str, params: dict[str, Any], label: str, *, causal: bool,
                         mixer: str) -> Placement:
    """One self-attention in every block, the variant's (an encoder, a ViT); with a recurrent
    mixer no part attends."""
    base = {"attention": variant, "attention_params": params}
    if mixer != "attention":
        return Placement(base, f"no attention ({mixer} layers)")
    return Placement(base, f"self-attention={label}")


def place_causal_self_attention(variant: str, params: dict[str, Any], label: str, *,
                                causal: bool, mixer: str) -> Placement:
    """A decoder: the variant is every block's causal self-attention; a variant without a
    causal form cannot be one (unsupported, with the reason)."""
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
    """Decorator registering a model class built as ``cls(config)`` under ``kind``, with how a
    variant's attention is placed into it (default: it is every block's self-attention)."""

    def decorator(cls: T) -> T:
        MODELS.add(kind, ModelEntry(cls, config_cls, place), source=source_of(cls),  # type: ignore[arg-type]
                   overwrite=overwrite)
        return cls

    return decorator


def unregister_model(kind: str) -> None:
    """Remove model kind ``kind``; no error if it is absent."""
    MODELS.remove(kind)
