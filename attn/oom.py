"""What counts as running out of memory, for kernels that must not hide it and for ``oom`` rows."""

from __future__ import annotations

#: what an allocation failure says in its message (torch's CPU allocator, CUDA, the C library)
_OOM_MARKERS = ("can't allocate", "out of memory", "not enough memory", "cannot allocate")


def is_oom_error(err: BaseException) -> bool:
    """True for an allocation failure, also one a compiler wrapped (read through ``__cause__`` / ``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or type(current).__name__ == "OutOfMemoryError":
            return True
        if any(marker in str(current).lower() for marker in _OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False
