"""Attention for long sequences: variant semantics, kernels, registry and conformance kit.

Public interface (docs/contract.md): :func:`register_attention`, :func:`create_attention`,
:func:`list_attention`, :func:`attention_info`; every module follows the tensor contract
``forward(q, k, v, *, causal=False, key_mask=None)`` with ``(B, H, N, D)`` tensors.
A plain ``nn.Module`` with that forward can be registered as it is (see :mod:`attn.plain_module`).
"""

from attn.base import Attention, Band, ExactAttention, KernelPath
from attn.call import AttentionCall
from attn.kernels import get_kernel, list_kernels
from attn.mods import MaskMod, ScoreMod
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

__all__ = [
    "Attention",
    "AttentionCall",
    "AttentionInfo",
    "Band",
    "ExactAttention",
    "KernelPath",
    "MaskMod",
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
]
