"""What counts as running out of memory: for the kernels that must not hide it (a compiled
kernel's fallback) and for the benchmark's rows and memory readings, which mark it ``oom``."""

from __future__ import annotations

#: what an allocation failure says in its message (torch's CPU allocator, CUDA, the C library)
_OOM_MARKERS = ("can't allocate", "out of memory", "not enough memory", "cannot allocate")


def is_oom_error(err: BaseException) -> bool:
    """True for an allocation failure (``MemoryError``, ``torch.OutOfMemoryError``, torch's
    "can't allocate", CUDA OOM), also one a compiler wrapped in its own error (read through
    ``__cause__`` / ``__context__``)."""
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
