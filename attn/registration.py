"""The table of registered attentions and the decorator that fills it (:func:`register_attention`).

Below the variants in the import layers: every built-in variant module imports this to
register itself, and :mod:`attn.registry` (create, list, describe, plug-ins) imports
:mod:`attn.variants` at its top, so imports run one way.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import nn

from attn.base import Attention
from attn.plain_module import CONTRACT, contract_problem

T = TypeVar("T")


@dataclass
class Registry:
    """Registered attentions by name, where each came from, and the plug-in loading state."""

    entries: dict[str, Callable[..., nn.Module]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    plugins_loaded: bool = False
    plugin_errors: dict[str, str] = field(default_factory=dict)


REGISTRY = Registry()


def register_attention(name: str, *, overwrite: bool = False) -> Callable[[T], T]:
    """Decorator registering an :class:`Attention` subclass, a plain module class or a factory.

    A plain module class (an ``nn.Module`` that is not an Attention) must have a forward
    callable as ``forward(q, k, v, *, causal=False, key_mask=None)``; the object itself is
    returned unchanged.
    """
    _require_name(name)

    def decorator(obj: T) -> T:
        _require_registrable(name, obj)
        existing = REGISTRY.entries.get(name)
        if existing is not None and existing is not obj and not overwrite:
            raise ValueError(
                f"register_attention: name {name!r} is already registered by "
                f"{REGISTRY.sources[name]}; pass overwrite=True to replace it"
            )
        if inspect.isclass(obj) and issubclass(obj, Attention):
            obj.name = name
        REGISTRY.entries[name] = obj
        REGISTRY.sources[name] = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', obj)}"
        return obj

    return decorator


def _require_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            "register_attention: 'name' must be an identifier string (letters, digits and "
            f"underscores, e.g. {identifier_like(str(name))!r}); got {name!r}"
        )


def identifier_like(name: str) -> str:
    """A valid attention name close to ``name`` (for error messages)."""
    fixed = re.sub(r"\W", "_", name) or "my_attention"
    return f"_{fixed}" if fixed[0].isdigit() else fixed


def _require_registrable(name: str, obj: Any) -> None:
    """Raise ``ValueError`` unless ``obj`` is an Attention subclass, a plain module class
    following the contract, or a (non-class) factory."""
    allowed = "an attn.Attention subclass, an nn.Module subclass with the contract's forward, or a factory"
    if not callable(obj):
        raise ValueError(f"register_attention({name!r}): expected {allowed}; got {obj!r}, which is not callable")
    if not inspect.isclass(obj) or issubclass(obj, Attention):
        return
    if not issubclass(obj, nn.Module):
        raise ValueError(
            f"register_attention({name!r}): expected {allowed}; got class {obj.__qualname__}, "
            "which is not an nn.Module"
        )
    problem = contract_problem(obj)
    if problem is not None:
        raise ValueError(f"register_attention({name!r}): a plain module must follow {CONTRACT}; {problem}")


def unregister_attention(name: str) -> None:
    """Remove ``name`` from the registry (used by tests and plug-in reloads)."""
    REGISTRY.entries.pop(name, None)
    REGISTRY.sources.pop(name, None)
