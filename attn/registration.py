"""The table of registered attentions and :func:`register_attention`, below the variants in the import layers
(:mod:`attn.registry` imports :mod:`attn.variants`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from attn.base import Attention
from attn.plain_module import CONTRACT, contract_problem
from attn.table import RegistrationError, Table

T = TypeVar("T")


class Registry(Table[Callable[..., nn.Module]]):
    """The registered attentions (an :class:`~attn.table.Table`) and the plug-in loading state."""

    def __init__(self) -> None:
        super().__init__("register_attention")
        self.plugins_loaded = False
        self.plugin_errors: dict[str, str] = {}


REGISTRY = Registry()


def register_attention(name: str, *, overwrite: bool = False) -> Callable[[T], T]:
    """Decorator registering an :class:`Attention` subclass, a plain module class (keeping the contract's
    forward) or a factory; returns the object unchanged."""
    REGISTRY.check_name(name)

    def decorator(obj: T) -> T:
        _require_registrable(name, obj)
        REGISTRY.add(name, obj, overwrite=overwrite)  # type: ignore[arg-type]
        if inspect.isclass(obj) and issubclass(obj, Attention):
            obj.name = name
        return obj

    return decorator


def _require_registrable(name: str, obj: Any) -> None:
    """``RegistrationError`` unless ``obj`` is an Attention subclass, a plain module class or a factory."""
    allowed = "an attn.Attention subclass, an nn.Module subclass with the contract's forward, or a factory"
    if not callable(obj):
        raise RegistrationError(f"register_attention({name!r}): expected {allowed}; got {obj!r}, which is not callable")
    if not inspect.isclass(obj) or issubclass(obj, Attention):
        return
    if not issubclass(obj, nn.Module):
        raise RegistrationError(
            f"register_attention({name!r}): expected {allowed}; got class {obj.__qualname__}, "
            "which is not an nn.Module"
        )
    problem = contract_problem(obj)
    if problem is not None:
        raise RegistrationError(f"register_attention({name!r}): a plain module must follow {CONTRACT}; {problem}")


def unregister_attention(name: str) -> None:
    """Remove ``name`` from the registry (used by tests and plug-in reloads)."""
    REGISTRY.remove(name)
