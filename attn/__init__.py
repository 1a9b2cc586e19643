"""Attention for long sequences: variant semantics, kernels, registry and conformance kit.

Public interface (DESIGN 3): :func:`register_attention`, :func:`create_attention`,
:func:`list_attention`, :func:`attention_info`; every module follows the tensor contract
``forward(q, k, v, *, causal=False, key_mask=None)`` with ``(B, H, N, D)`` tensors.
"""

from attn.base import Attention, Band, ExactAttention, KernelPath
from attn.kernels import get_kernel, list_kernels
from attn.mods import MaskMod, ScoreMod
from attn.registry import (
    AttentionInfo,
    attention_info,
    create_attention,
    list_attention,
    load_plugins,
    register_attention,
)

__all__ = [
    "Attention",
    "AttentionInfo",
    "Band",
    "ExactAttention",
    "KernelPath",
    "MaskMod",
    "ScoreMod",
    "attention_info",
    "create_attention",
    "get_kernel",
    "list_attention",
    "list_kernels",
    "load_plugins",
    "register_attention",
]
