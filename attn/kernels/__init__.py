"""Kernels: implementations that run an attention's :class:`~attn.pattern.Pattern` on some device.

Each kernel declares ``not_supported_reasons(pattern, call) -> list[str]`` for an
:class:`~attn.call.AttentionCall` (empty = supported, else the reasons; ``call=None``: the
pattern alone) and ``run(pattern, q, k, v, causal, key_mask) -> (output, KernelPath)``.
A variant's kernels are the ones that support its pattern (:func:`kernels_for`).
"""

from __future__ import annotations

import importlib
from functools import cache

from attn.kernels.base import Kernel
from attn.pattern import Pattern

#: the built-in kernels, one ``module:class`` line each, in the order variants list them
BUILTIN_KERNELS: tuple[str, ...] = (
    "attn.kernels.reference:ReferenceKernel",
    "attn.kernels.sdpa:SdpaKernel",
    "attn.kernels.native:NativeKernel",
    "attn.kernels.blocked:BlockedKernel",
    "attn.kernels.chunked:ChunkedKernel",
    "attn.kernels.flex:FlexKernel",
    "attn.kernels.xformers:XformersKernel",
)


@cache
def _builtin_kernels() -> dict[str, Kernel]:
    """The kernel table, name -> instance, in :data:`BUILTIN_KERNELS` order.

    Imports each kernel's module here, by name: the table above names every kernel once, so
    adding a kernel is its file plus one line there.
    """
    kernels: list[Kernel] = []
    for entry in BUILTIN_KERNELS:
        module, _, cls = entry.partition(":")
        kernels.append(getattr(importlib.import_module(module), cls)())
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


def kernel_names() -> tuple[str, ...]:
    """Names of all kernels in table order (the order :func:`kernels_for` lists them)."""
    return tuple(_builtin_kernels())


def kernels_for(pattern: Pattern) -> tuple[str, ...]:
    """The kernels that can run ``pattern`` on some call (their ``not_supported_reasons(pattern)``
    is empty), in table order: what a variant's kernels are."""
    return tuple(name for name, kernel in _builtin_kernels().items() if not kernel.not_supported_reasons(pattern))


__all__ = ["BUILTIN_KERNELS", "Kernel", "get_kernel", "kernel_names", "kernels_for", "list_kernels"]
