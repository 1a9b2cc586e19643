"""The attention registry: register by decorator or entry point, create by name.

Built-in variants live in :mod:`attn.variants` (imported on first use); third-party
packages register through the entry-point group ``attn_bench.attention`` with
``name = "module:object"``, where the object is an :class:`~attn.base.Attention` subclass or
a factory returning an attention module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module, metadata
from typing import Any, TypeVar

from torch import nn

from attn.base import Attention

ENTRY_POINT_GROUP = "attn_bench.attention"
_RESERVED = ("kernel", "num_heads", "head_dim")

T = TypeVar("T")


@dataclass(frozen=True)
class AttentionInfo:
    """What a registered attention is and how to call it."""

    name: str
    description: str
    params: dict[str, Any]
    kernels: tuple[str, ...]
    supports_causal: bool
    exact: bool
    source: str
    example_params: tuple[dict[str, Any], ...] = field(default=({},))
    forces_causal: bool = False


@dataclass
class _Registry:
    entries: dict[str, Callable[..., nn.Module]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    builtins_loaded: bool = False
    plugins_loaded: bool = False
    plugin_errors: dict[str, str] = field(default_factory=dict)


_registry = _Registry()


def register_attention(name: str, *, overwrite: bool = False) -> Callable[[T], T]:
    """Decorator registering an :class:`Attention` subclass or a factory under ``name``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_attention: 'name' must be an identifier string; got {name!r}")

    def decorator(obj: T) -> T:
        if not callable(obj):
            raise ValueError(f"register_attention({name!r}): expected a class or factory; got {obj!r}")
        existing = _registry.entries.get(name)
        if existing is not None and existing is not obj and not overwrite:
            raise ValueError(
                f"register_attention: name {name!r} is already registered by "
                f"{_registry.sources[name]}; pass overwrite=True to replace it"
            )
        if inspect.isclass(obj) and issubclass(obj, Attention):
            obj.name = name
        _registry.entries[name] = obj
        _registry.sources[name] = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', obj)}"
        return obj

    return decorator


def unregister_attention(name: str) -> None:
    """Remove ``name`` from the registry (used by tests and plug-in reloads)."""
    _registry.entries.pop(name, None)
    _registry.sources.pop(name, None)


def _ensure_loaded() -> None:
    if not _registry.builtins_loaded:
        _registry.builtins_loaded = True
        import_module("attn.variants")
    if not _registry.plugins_loaded:
        _registry.plugins_loaded = True
        load_plugins()


def load_plugins(*, reload: bool = False) -> dict[str, str]:
    """Load entry points of group ``attn_bench.attention``; returns {name: error} for failures.

    A broken plug-in never breaks the built-ins: its error is kept and shown by
    ``attn-bench list``.
    """
    if reload:
        _registry.plugin_errors.clear()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry.entries and not reload:
            continue
        try:
            obj = ep.load()
        except Exception as err:  # a plug-in's own bug must not hide the others
            _registry.plugin_errors[ep.name] = f"{type(err).__name__}: {err}"
            continue
        if _registry.entries.get(ep.name) is not obj:
            register_attention(ep.name, overwrite=reload)(obj)
        _registry.sources[ep.name] = f"entry point {ep.value}"
    return dict(_registry.plugin_errors)


def plugin_errors() -> dict[str, str]:
    """Errors raised while loading plug-ins, by entry-point name."""
    _ensure_loaded()
    return dict(_registry.plugin_errors)


def list_attention() -> list[str]:
    """Names of every registered attention, built-in and plug-in, sorted."""
    _ensure_loaded()
    return sorted(_registry.entries)


def _lookup(name: str) -> Callable[..., nn.Module]:
    _ensure_loaded()
    if name not in _registry.entries:
        raise ValueError(
            f"attention: unknown name {name!r}; registered attentions are "
            f"{', '.join(sorted(_registry.entries))}"
        )
    return _registry.entries[name]


def constructor_params(obj: Callable[..., Any]) -> dict[str, Any]:
    """User-facing parameters of a class or factory with their defaults (follows **kwargs up the MRO)."""
    params: dict[str, Any] = {}
    targets = [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if inspect.isclass(obj) else [obj]
    for target in targets:
        if target is object.__init__ or target is nn.Module.__init__:
            break
        sig = inspect.signature(target)
        more = False
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.kind is not p.VAR_POSITIONAL and p.name != "self" and p.name not in _RESERVED:
                params.setdefault(p.name, None if p.default is p.empty else p.default)
        if not more:
            break
    return params


def create_attention(
    name: str,
    *,
    num_heads: int | None = None,
    head_dim: int | None = None,
    kernel: str = "auto",
    **params: Any,
) -> Attention:
    """Build the attention registered as ``name`` with ``params``; the kernel may be ``"auto"``.

    Unknown names and parameters raise ``ValueError`` listing what is allowed.
    """
    factory = _lookup(name)
    allowed = constructor_params(factory)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"{name}: unknown parameter(s) {', '.join(map(repr, unknown))}; allowed parameters "
            f"are {', '.join(map(repr, sorted(allowed))) or 'none'}"
        )
    module = factory(kernel=kernel, num_heads=num_heads, head_dim=head_dim, **params)
    if not isinstance(module, Attention):
        raise TypeError(
            f"{name}: the registered factory returned {type(module).__name__}; it must return an "
            "attn.Attention (subclass Attention and implement native_forward, or ExactAttention)"
        )
    return module


def attention_info(name: str) -> AttentionInfo:
    """Description, parameters with defaults, kernels and causal support of ``name``."""
    factory = _lookup(name)
    cls = factory if inspect.isclass(factory) else None
    probe = cls or Attention
    doc = inspect.getdoc(factory) or ""
    return AttentionInfo(
        name=name,
        description=doc.split("\n\n")[0].replace("\n", " "),
        params=constructor_params(factory),
        kernels=tuple(getattr(probe, "kernels", ("native",))),
        supports_causal=bool(getattr(probe, "supports_causal", True)),
        exact=bool(getattr(probe, "exact", True)),
        source=_registry.sources.get(name, "?"),
        example_params=tuple(getattr(probe, "example_params", ({},))),
        forces_causal=bool(getattr(probe, "forces_causal", False)),
    )
