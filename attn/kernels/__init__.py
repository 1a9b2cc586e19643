"""Kernels: implementations that run an attention's :class:`~attn.pattern.Pattern` on some device.

Each kernel declares ``not_supported_reasons(pattern, call) -> list[str]`` for an
:class:`~attn.call.AttentionCall` (empty = supported, else the reasons; ``call=None``: the
pattern alone) and ``run(pattern, q, k, v, causal, key_mask) -> (output, KernelPath)``.
A variant's kernels are the ones that support its pattern (:func:`kernels_for`).

A kernel outside this package (a plug-in module, a test) joins the table with
:func:`register_kernel`; it then serves every variant whose pattern it supports.
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
    "attn.kernels.relative:RelativeKernel",
    "attn.kernels.factorised:FactorisedKernel",
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


#: kernels registered from outside this package (name -> instance), after the built-ins
_PLUGIN_KERNELS: dict[str, Kernel] = {}


def register_kernel(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: add a :class:`Kernel` subclass to the kernel table under its ``name``.

    ``ValueError`` when the name is taken by a built-in or another plug-in kernel (a module
    imported twice registers the same class again, which is allowed)."""
    if not (isinstance(cls, type) and issubclass(cls, Kernel)):
        raise TypeError(f"register_kernel: expected a Kernel subclass; got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_kernel: {cls.__qualname__} must set a non-empty class attribute 'name'")
    taken = _builtin_kernels().get(name) or _PLUGIN_KERNELS.get(name)
    if taken is not None and type(taken).__qualname__ != cls.__qualname__:
        raise ValueError(f"register_kernel: kernel name {name!r} is taken by "
                         f"{type(taken).__qualname__}; known kernels are {list_kernels()}")
    _PLUGIN_KERNELS[name] = cls()
    return cls


def unregister_kernel(name: str) -> None:
    """Remove a kernel added by :func:`register_kernel` (built-ins stay)."""
    _PLUGIN_KERNELS.pop(name, None)


def _kernel_table() -> dict[str, Kernel]:
    """Every kernel, name -> instance: the built-ins in table order, then the plug-ins."""
    return {**_builtin_kernels(), **_PLUGIN_KERNELS}


def get_kernel(name: str) -> Kernel:
    """The kernel registered as ``name``; ``ValueError`` listing the known ones otherwise."""
    kernels = _kernel_table()
    if name not in kernels:
        raise ValueError(f"kernel: unknown kernel {name!r}; known kernels are {sorted(kernels)}")
    return kernels[name]


def list_kernels() -> list[str]:
    """Names of all kernels."""
    return sorted(_kernel_table())


def kernel_names() -> tuple[str, ...]:
    """Names of all kernels in table order (the order :func:`kernels_for` lists them)."""
    return tuple(_kernel_table())


def kernels_for(pattern: Pattern) -> tuple[str, ...]:
    """The kernels that can run ``pattern`` on some call (their ``not_supported_reasons(pattern)``
    is empty), in table order: what a variant's kernels are."""
    return tuple(name for name, kernel in _kernel_table().items()
                 if not kernel.not_supported_reasons(pattern))


__all__ = ["BUILTIN_KERNELS", "Kernel", "get_kernel", "kernel_names", "kernels_for", "list_kernels",
           "register_kernel", "unregister_kernel"]
