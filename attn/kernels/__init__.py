"""Kernels, the implementations that run an attention's :class:`~attn.pattern.Pattern`, and their table
(docs/kernels.md); a kernel outside this package joins it with :func:`register_kernel`."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from attn.kernels.base import Kernel
from attn.pattern import Pattern
from attn.table import RegistrationError, Table, source_of

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


#: every kernel by name: the built-ins (registered on first use), then the plug-ins
KERNELS: Table[Kernel] = Table("register_kernel")


@cache
def _kernel_table() -> Table[Kernel]:
    """:data:`KERNELS`, the built-ins first registered (imported by name) in :data:`BUILTIN_KERNELS` order."""
    for entry in BUILTIN_KERNELS:
        module, _, cls = entry.partition(":")
        kernel = getattr(importlib.import_module(module), cls)()
        KERNELS.add(kernel.name, kernel, source=entry)
    return KERNELS


def register_kernel(cls: type[Kernel] | None = None, *, overwrite: bool = False) -> Any:
    """Class decorator: add a :class:`Kernel` subclass, built with no arguments, under its ``name``."""

    def decorator(cls: type[Kernel]) -> type[Kernel]:
        if not (isinstance(cls, type) and issubclass(cls, Kernel)):
            raise RegistrationError(f"register_kernel: 'cls' must be a Kernel subclass; got {cls!r}")
        kernels = _kernel_table()
        kernels.add(kernels.check_name(cls.name), cls(), source=source_of(cls), overwrite=overwrite)
        return cls

    return decorator if cls is None else decorator(cls)


def unregister_kernel(name: str) -> None:
    """Remove kernel ``name`` from the table."""
    _kernel_table().remove(name)


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
    """The kernels whose ``not_supported_reasons(pattern)`` is empty, in table order."""
    return tuple(name for name, kernel in _kernel_table().items()
                 if not kernel.not_supported_reasons(pattern))


__all__ = ["BUILTIN_KERNELS", "KERNELS", "Kernel", "get_kernel", "kernel_names", "kernels_for", "list_kernels",
           "register_kernel", "unregister_kernel"]
