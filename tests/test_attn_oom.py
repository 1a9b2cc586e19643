"""What counts as out of memory (`attn.oom.is_oom_error`), shared by the kernels' fallbacks
and the benchmark's `oom` rows."""

from __future__ import annotations

import pytest
import torch

from attn.oom import is_oom_error


@pytest.mark.parametrize("err", [
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 17179869184 bytes"),
    RuntimeError("Cannot allocate memory"),
])
def test_allocation_failures_count(err: BaseException) -> None:
    assert is_oom_error(err)


def test_an_allocation_failure_wrapped_by_a_compiler_counts() -> None:
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("backend='inductor' raised: lowering failed") from inner
    except RuntimeError as outer:
        assert is_oom_error(outer)
    try:
        try:
            raise MemoryError
        except MemoryError:
            raise ValueError("while handling it, another error") from None
    except ValueError as suppressed:
        # ``from None`` keeps the context but says it is not the cause; it still ran out
        assert is_oom_error(suppressed)


def test_other_errors_do_not_count_and_a_cycle_of_causes_ends() -> None:
    assert not is_oom_error(RuntimeError("shape mismatch: (2, 3) and (4, 5)"))
    assert not is_oom_error(ValueError("window: must be at least 1; got 0"))
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert not is_oom_error(first)
