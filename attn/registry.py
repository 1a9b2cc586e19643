"""The attention registry: register by decorator or entry point (group ``attn_bench.attention``), create by name
(docs/extending.md); a plug-in that cannot be loaded is skipped, its error kept in :func:`plugin_errors`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch
from torch import nn

import attn.variants  # noqa: F401  (registers the built-in variants)
from attn.base import PROBE_DIM, PROBE_HEADS, Attention
from attn.kernels import get_kernel, kernel_names
from attn.kernels.base import compute_dtype
from attn.plain_module import (
    CONTRACT,
    PlainModuleAttention,
    contract_problem,
    is_plain_module_class,
    plain_traits,
)
from attn.registration import REGISTRY as _registry
from attn.registration import register_attention, unregister_attention
from attn.table import identifier_like
from attn.validation import require_choice

__all__ = [
    "ENTRY_POINT_GROUP", "AttentionInfo", "attention_info", "build_attention", "check_attention_params",
    "constructor_params",
    "create_attention", "list_attention", "load_plugins", "plugin_errors", "register_attention",
    "unregister_attention",
]

ENTRY_POINT_GROUP = "attn_bench.attention"
_RESERVED = ("kernel", "num_heads", "head_dim")


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
    supports_gqa: bool = True  # k, v may have fewer heads than q (grouped-query attention)


def _ensure_loaded() -> None:
    if not _registry.plugins_loaded:
        _registry.plugins_loaded = True
        load_plugins()


def load_plugins(*, reload: bool = False) -> dict[str, str]:
    """Load entry points of group ``attn_bench.attention``, skipping a broken one; returns {name: one-line error}.
    ``reload=True`` forgets old errors and registers every entry point again."""
    if reload:
        _registry.plugin_errors.clear()
    try:
        entry_points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as err:  # unreadable installed metadata must not break the built-ins
        _registry.plugin_errors[ENTRY_POINT_GROUP] = f"cannot list entry points: {_one_line(err)}"
        return dict(_registry.plugin_errors)
    for ep in entry_points:
        error = _load_entry_point(ep, reload=reload)
        if error is None:
            _registry.plugin_errors.pop(ep.name, None)
        else:
            _registry.plugin_errors[ep.name] = error
    return dict(_registry.plugin_errors)


def _load_entry_point(ep: metadata.EntryPoint, *, reload: bool) -> str | None:
    """Register one entry point; the one-line reason it was skipped, or None."""
    where = f"entry point {ep.name} = {ep.value}"
    if not ep.name.isidentifier():
        return (
            f"{where}: the name {ep.name!r} is not a valid attention name; it must be an identifier "
            f"(letters, digits and underscores, e.g. {identifier_like(ep.name)!r})"
        )
    source = f"entry point {ep.value}"
    current = _registry.sources.get(ep.name)
    # current == ep.value: the entry point's own module registered the same object by decorator
    if current is not None and current not in (source, ep.value):
        return f"{where}: the name {ep.name!r} is already registered by {current}; the plug-in was not loaded"
    if current is not None and not reload:
        _registry.sources[ep.name] = source
        return None
    try:
        obj = ep.load()
        register_attention(ep.name, overwrite=True)(obj)  # replaces only this entry point's own earlier load
    except Exception as err:  # a plug-in's own bug must not hide the others
        return f"{where}: {_one_line(err)}"
    _registry.sources[ep.name] = source
    return None


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def plugin_errors() -> dict[str, str]:
    """Errors raised while loading plug-ins, by entry-point name (one line each)."""
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
    """Build the attention registered as ``name`` (a plain module comes wrapped); ``ValueError`` for an unknown
    name or parameter lists what is allowed."""
    factory = _lookup(name)
    _check_known(name, factory, params)
    return build_attention(factory, name=name, kernel=kernel, num_heads=num_heads, head_dim=head_dim, **params)


def check_attention_params(
    name: str,
    *,
    num_heads: int | None = None,
    head_dim: int | None = None,
    kernel: str = "auto",
    **params: Any,
) -> None:
    """``ValueError`` for anything :func:`create_attention` would refuse, without building a module (a plain
    module or factory declares no rules: only its parameter names are checked)."""
    factory = _lookup(name)
    _check_known(name, factory, params)
    if inspect.isclass(factory) and issubclass(factory, Attention):
        values = {**constructor_params(factory), **params}
        factory.check_params(kernel=kernel, num_heads=num_heads, head_dim=head_dim, **values)


def _check_known(name: str, factory: Callable[..., Any], params: dict[str, Any]) -> None:
    """``ValueError`` naming the parameters ``factory`` does not take, and those it takes."""
    allowed = constructor_params(factory)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"{name}: unknown parameter(s) {', '.join(map(repr, unknown))}; allowed parameters "
            f"are {', '.join(map(repr, sorted(allowed))) or 'none'}"
        )


def build_attention(
    obj: Callable[..., nn.Module],
    *,
    name: str | None = None,
    kernel: str = "auto",
    num_heads: int | None = None,
    head_dim: int | None = None,
    **params: Any,
) -> Attention:
    """Build an attention from ``obj`` directly (``create_attention`` after the lookup): an :class:`Attention`
    subclass (called with every argument), a plain module class (called with ``params`` plus the ``num_heads`` /
    ``head_dim`` its ``__init__`` takes) or a factory returning either; ``name`` names a wrapped plain module."""
    if not (isinstance(name, str) and name):
        name = getattr(obj, "name", None)
        name = name if isinstance(name, str) else getattr(obj, "__name__", type(obj).__name__)
    if inspect.isclass(obj) and issubclass(obj, Attention):
        return obj(kernel=kernel, num_heads=num_heads, head_dim=head_dim, **params)
    if is_plain_module_class(obj):
        require_choice(f"{name}: parameter 'kernel'", kernel, ("auto", *PlainModuleAttention.class_kernels()))
        inner = obj(**params, **_reserved_arguments(name, obj, num_heads=num_heads, head_dim=head_dim))
        return PlainModuleAttention(inner, name=name, kernel=kernel, num_heads=num_heads, head_dim=head_dim)
    reserved = _reserved_arguments(name, obj, kernel=kernel, num_heads=num_heads, head_dim=head_dim)
    built = obj(**params, **reserved)
    if isinstance(built, Attention):
        if "kernel" not in reserved and kernel != built.kernel:
            built.kernel = require_choice(f"{name}: parameter 'kernel'", kernel,
                                          ("auto", *built.supported_kernels()))
        return built
    problem = contract_problem(built) if isinstance(built, nn.Module) else "it is not an nn.Module"
    if problem is not None:
        raise TypeError(
            f"{name}: the registered factory returned {type(built).__name__}; it must return an "
            "attn.Attention (subclass Attention and implement native_forward, or ExactAttention) or "
            f"an nn.Module with {CONTRACT} ({problem})"
        )
    return PlainModuleAttention(built, name=name, kernel=kernel, num_heads=num_heads, head_dim=head_dim)


def _init_signature(obj: Callable[..., Any]) -> inspect.Signature | None:
    """The signature a class's own ``__init__`` (or a factory) is called with; None if it takes nothing."""
    if not inspect.isclass(obj):
        return inspect.signature(obj)
    init = next(c.__init__ for c in obj.__mro__ if "__init__" in vars(c))
    return None if init is object.__init__ or init is nn.Module.__init__ else inspect.signature(init)


def _reserved_arguments(name: str, obj: Callable[..., Any], **values: Any) -> dict[str, Any]:
    """The reserved arguments ``obj`` accepts (None left out); ``ValueError`` if a required one is None."""
    try:
        signature = _init_signature(obj)
    except (TypeError, ValueError):  # not introspectable: pass what was given, as before
        return {arg: value for arg, value in values.items() if value is not None}
    if signature is None:
        return {}
    named = {p.name: p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    arguments = {}
    for arg, value in values.items():
        if value is None and arg in named and named[arg].default is inspect.Parameter.empty:
            raise ValueError(f"{name}: parameter {arg!r} is required (its constructor asks for it); got None")
        if value is not None and (arg in named or takes_any):
            arguments[arg] = value
    return arguments


def kernel_compute_dtype(name: str, kernel: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the matmuls of ``name`` on ``kernel`` run in for ``dtype`` inputs (float32 where half
    inputs are upcast), for a row's peak fraction; ``dtype`` for an unknown name or kernel."""
    try:
        factory = _lookup(name)
        chosen = get_kernel(kernel)
    except (KeyError, ValueError):
        return dtype
    native = bool(getattr(factory, "native_computes_half_in_float32", False))
    return compute_dtype(chosen, dtype, native_in_float32=native)


def attention_info(name: str) -> AttentionInfo:
    """Description, parameters with defaults, kernels and causal support of ``name``."""
    factory = _lookup(name)
    if is_plain_module_class(factory):  # its own docstring (not nn.Module's) and declared traits
        doc, kernels = inspect.cleandoc(factory.__doc__ or ""), PlainModuleAttention.class_kernels()
        traits = plain_traits(factory)
    else:  # an Attention subclass, or a factory (read as Attention)
        doc, kernels = inspect.getdoc(factory) or "", _kernels_of(name, factory)
        traits = plain_traits(factory if inspect.isclass(factory) else Attention)
    return AttentionInfo(
        name=name, description=doc.split("\n\n")[0].replace("\n", " "), params=constructor_params(factory),
        kernels=kernels, supports_causal=traits.supports_causal, exact=traits.exact,
        source=_registry.sources.get(name, "?"), example_params=traits.example_params,
        forces_causal=traits.forces_causal, supports_gqa=traits.supports_gqa,
    )


def _kernels_of(name: str, factory: Callable[..., Any]) -> tuple[str, ...]:
    """The kernels of a registered class, or of what a factory builds with its defaults (else all)."""
    if inspect.isclass(factory) and issubclass(factory, Attention):
        return factory.class_kernels()
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            built = build_attention(factory, name=name, num_heads=PROBE_HEADS, head_dim=PROBE_DIM)
        return built.supported_kernels()
    except Exception:  # e.g. a required argument without a default
        return kernel_names()
