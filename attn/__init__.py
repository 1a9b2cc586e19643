"""Attention for long sequences: variants, kernels, registry and conformance kit (docs/contract.md).
Public names resolve on first use (PEP 562, docs/layout.md): a torch-free submodule loads no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_HOMES = {name: home for home, names in {
    "attn.base": ("Attention", "ExactAttention"),
    "attn.call": ("AttentionCall", "KernelPath"),
    "attn.kernels": ("get_kernel", "list_kernels", "register_kernel"),
    "attn.mods": ("MaskMod", "ScoreMod"),
    "attn.pattern": ("Band", "Pattern"),
    "attn.plain_module": ("PlainModuleAttention",),
    "attn.registry": ("AttentionInfo", "attention_info", "build_attention", "check_attention_params",
                      "create_attention", "list_attention", "load_plugins", "plugin_errors", "register_attention"),
}.items() for name in names}

__all__ = [
    "Attention",
    "AttentionCall",
    "AttentionInfo",
    "Band",
    "ExactAttention",
    "KernelPath",
    "MaskMod",
    "Pattern",
    "PlainModuleAttention",
    "ScoreMod",
    "attention_info",
    "build_attention",
    "check_attention_params",
    "create_attention",
    "get_kernel",
    "list_attention",
    "list_kernels",
    "load_plugins",
    "plugin_errors",
    "register_attention",
    "register_kernel",
]

if TYPE_CHECKING:  # for type checkers and IDEs only: the names resolve lazily at run time
    from attn.base import Attention, ExactAttention
    from attn.call import AttentionCall, KernelPath
    from attn.kernels import get_kernel, list_kernels, register_kernel
    from attn.mods import MaskMod, ScoreMod
    from attn.pattern import Band, Pattern
    from attn.plain_module import PlainModuleAttention
    from attn.registry import (
        AttentionInfo,
        attention_info,
        build_attention,
        check_attention_params,
        create_attention,
        list_attention,
        load_plugins,
        plugin_errors,
        register_attention,
    )


def __getattr__(name: str) -> Any:
    """Import the module defining public ``name`` on first use (after the registry) and cache it here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'attn' has no attribute {name!r}")
    importlib.import_module("attn.registry")  # the built-in variants are registered first
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
