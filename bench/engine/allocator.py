"""The memory allocator settings a run's processes start with, for ``env.json`` (docs/measurement.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: environment variables that choose or tune the process's memory allocator
ALLOCATOR_VARIABLES = (
    "LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX", "MALLOC_CONF", "THP_MEM_ALLOC_ENABLE",
)
#: glibc settings under which freed memory up to 1 GiB stays in the process
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
#: what :func:`allocator_settings` says when none of the variables is set
SYSTEM_DEFAULT = "system default"


def allocator_settings(environ: Mapping[str, str] | None = None) -> str:
    """The allocator variables set in ``environ`` as ``NAME=value; ...``, or :data:`SYSTEM_DEFAULT`."""
    environ = os.environ if environ is None else environ
    settings = [f"{name}={environ[name]}" for name in ALLOCATOR_VARIABLES if environ.get(name)]
    return "; ".join(settings) or SYSTEM_DEFAULT
