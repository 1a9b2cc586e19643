"""Which memory allocator settings a run's processes start with, as their environment says.

On a CPU every allocation that the C library hands out as fresh pages costs a page fault
per 4 KiB page on first touch. glibc's ``malloc`` serves large requests with ``mmap`` and
gives them back on ``free``, and trims the top of its heap once more than a threshold is
free there, so a kernel that allocates many megabytes per call pays those faults on every
call (``docs/measurement.md``, "Memory the allocator gives back"). Allocators that keep
freed memory (jemalloc or tcmalloc through ``LD_PRELOAD``, as torch's CPU launcher
``torch.backends.xeon.run_cpu`` sets up, or glibc with raised thresholds) do not. The
variables are read by the C library when a process starts, so they are set on the command
line of the sweep (its workers inherit them), never from inside Python; this module only
says which were set, for the run's ``env.json``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: environment variables that choose or tune the process's memory allocator
ALLOCATOR_VARIABLES = (
    "LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX", "MALLOC_CONF", "THP_MEM_ALLOC_ENABLE",
)
#: glibc settings under which freed memory up to 1 GiB stays in the process: requests below
#: 1 GiB come from the heap (not ``mmap``) and the heap's top is not given back below 1 GiB
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
#: what :func:`allocator_settings` says when none of the variables is set
SYSTEM_DEFAULT = "system default"


def allocator_settings(environ: Mapping[str, str] | None = None) -> str:
    """The allocator variables set in ``environ`` (this process's environment by default)
    as ``NAME=value`` joined by ``"; "``, in :data:`ALLOCATOR_VARIABLES` order, or
    :data:`SYSTEM_DEFAULT` when none is set."""
    environ = os.environ if environ is None else environ
    settings = [f"{name}={environ[name]}" for name in ALLOCATOR_VARIABLES if environ.get(name)]
    return "; ".join(settings) or SYSTEM_DEFAULT
