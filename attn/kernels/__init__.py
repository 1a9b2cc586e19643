"""Kernels: implementations that run an attention's semantics on some device.

Each kernel declares ``not_supported_reasons(attention, call) -> list[str]`` for an
:class:`~attn.call.AttentionCall` (empty = supported, else the reasons) and
``run(...) -> (output, KernelPath)``.
"""

from __future__ import annotations

from functools import cache

from attn.kernels.base import Kernel
from attn.kernels.blocked import BlockedKernel
from attn.kernels.chunked import ChunkedKernel
from attn.kernels.flex import FlexKernel
from attn.kernels.native import NativeKernel
from attn.kernels.reference import ReferenceKernel
from attn.kernels.sdpa import SdpaKernel
from attn.kernels.xformers import XformersKernel


@cache
def _builtin_kernels() -> dict[str, Kernel]:
    kernels: list[Kernel] = [
        ReferenceKernel(), SdpaKernel(), NativeKernel(), BlockedKernel(), ChunkedKernel(),
        FlexKernel(), XformersKernel(),
    ]
    return {k.name: k for k in kernels}


def get_kernel(name: str) -> Kernel:
    """The kernel registered as ``name``; ``ValueError`` listing the known ones otherwise."""
    kernels = _builtin_kernels()
    if name not in kernels:
        raise ValueError(f"kernel: unknown kernel {name!r}; known kernels are {sorted(kernels)}")
    return kernels[name]


def list_kernels() -> list[str]:
    """Names of all kernels."""
    return sorted(_builtin_kernels())


__all__ = ["Kernel", "get_kernel", "list_kernels"]
