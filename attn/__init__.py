"""Attention for long sequences: variant semantics, kernels, registry and conformance kit (docs/contract.md).

The public names below resolve on first use (PEP 562), so importing a torch-free submodule such
as :mod:`attn.validation` does not load torch or the registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_HOMES = {
    "Attention": "attn.base",
    "AttentionCall": "attn.call",
    "AttentionInfo": "attn.registry",
    "Band": "attn.pattern",
    "ExactAttention": "attn.base",
    "KernelPath": "attn.call",
    "MaskMod": "attn.mods",
    "Pattern": "attn.pattern",
    "PlainModuleAttention": "attn.plain_module",
    "ScoreMod": "attn.mods",
    "attention_info": "attn.registry",
    "build_attention": "attn.registry",
    "check_attention_params": "attn.registry",
    "create_attention": "attn.registry",
    "get_kernel": "attn.kernels",
    "list_attention": "attn.registry",
    "list_kernels": "attn.kernels",
    "load_plugins": "attn.registry",
    "plugin_errors": "attn.registry",
    "register_attention": "attn.registry",
    "register_kernel": "attn.kernels",
}

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
