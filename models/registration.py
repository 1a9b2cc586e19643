"""The table of model kinds and the decorator that fills it (:func:`register_model`).

A kind registers its builder, its config class and how a variant's attention is placed into
it (:class:`Placement`: which parts of the model take the variant, which stay another
attention, and whether the kind can take the variant at all). The two placements most kinds
share are here (:func:`place_self_attention`, :func:`place_causal_self_attention`); a kind
with other parts writes its own beside its class (``models/encoder_decoder.py``).

The bottom of the model layers above the configs: model modules import this to register
themselves, and :mod:`models.registry` imports the model modules, so imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch import nn

import attn
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
    """A registered kind: its builder (``builder(config)``), its config class and how a
    variant's attention is placed into it."""

    builder: Callable[[ModelConfig], nn.Module]
    config_cls: type[ModelConfig]
    place: Place = place_self_attention


MODELS: dict[str, ModelEntry] = {}


def register_model(kind: str, config_cls: type[ModelConfig], *,
                   place: Place = place_self_attention) -> Callable[[T], T]:
    """Decorator registering a model class built as ``cls(config)`` under ``kind``, with the
    way a variant's attention is placed into it (default: the variant is every block's
    self-attention)."""

    def decorator(cls: T) -> T:
        if kind in MODELS and MODELS[kind].builder is not cls:
            raise ValueError(f"register_model: kind {kind!r} is already registered")
        MODELS[kind] = ModelEntry(cls, config_cls, place)  # type: ignore[arg-type]
        return cls

    return decorator
