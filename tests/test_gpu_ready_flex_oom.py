"""Flex never hides an out-of-memory error as a compile failure.

``torch.compile`` is replaced by fakes (no real compile: seconds each on this CPU) whose
compiled functions raise ``torch.OutOfMemoryError`` or another error: an OOM propagates (the
benchmark's row is ``oom``), any other failure runs eager flex for that call only and says so
in ``KernelPath.fallback``; the timings synchronise the device on CUDA."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from attn import create_attention, get_kernel
from attn.kernels import flex
from attn.oom import is_oom_error
from bench.engine.process import failure

REAL_COMPILE = torch.compile


class FakeCompile:
    """Stands in for ``torch.compile`` of the kernel's own calls: the compiled flex call raises
    ``flex_error`` (None: runs the function uncompiled), the compiled block-mask call raises
    ``mask_error``; whatever else torch compiles (eager flex does) is compiled for real."""

    def __init__(self) -> None:
        self.flex_error: BaseException | None = None
        self.mask_error: BaseException | None = None

    def __call__(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        name = getattr(fn, "__name__", "")
        if not name.startswith(("flex_call", "block_mask_call")):  # torch's own (eager flex)
            return REAL_COMPILE(fn, **options)
        is_mask = name.startswith("block_mask_call")

        def compiled(*args: Any) -> Any:
            error = self.mask_error if is_mask else self.flex_error
            if error is not None:
                raise error
            return fn(*args)

        return compiled


@pytest.fixture
def fake_compile(monkeypatch: pytest.MonkeyPatch) -> FakeCompile:
    fake = FakeCompile()
    monkeypatch.setattr(torch, "compile", fake)
    kernel = get_kernel("flex")  # fresh caches: no bucket compiled by a fake of another test
    monkeypatch.setattr(kernel, "_by_key", {})
    monkeypatch.setattr(kernel, "_by_owner", weakref.WeakKeyDictionary())
    return fake


def _inputs(n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, 16, generator=gen) for _ in range(3))  # (B, H, N, D) each


#: a length whose block mask is past the eager size (flex.EAGER_MASK_ELEMENTS): compiled
COMPILED_MASK_N = 192


def _oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")


def test_oom_while_compiling_flex_propagates_as_oom(fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    q, k, v = _inputs()
    fake_compile.flex_error = _oom()
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError) as raised:
        module(q, k, v)
    assert failure(raised.value, "cuda")[0] == "oom"


def test_oom_wrapped_by_the_compiler_still_propagates(fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    q, k, v = _inputs()
    try:
        raise _oom()
    except torch.OutOfMemoryError as cause:
        wrapped = RuntimeError("backend='inductor' raised: compile step failed")
        wrapped.__cause__ = cause
    fake_compile.flex_error = wrapped
    with torch.no_grad(), pytest.raises(RuntimeError) as raised:
        module(q, k, v)
    assert is_oom_error(raised.value) and failure(raised.value, "cuda")[0] == "oom"


def test_oom_while_building_the_block_mask_propagates(fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    q, k, v = _inputs(COMPILED_MASK_N)
    fake_compile.mask_error = _oom()
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError):
        module(q, k, v)


def test_a_compile_failure_falls_back_for_that_call_only(fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    ref = create_attention("sliding_window", window=4, kernel="reference")
    q, k, v = _inputs()
    fake_compile.flex_error = RuntimeError("graph break in a mask_mod")
    with torch.no_grad():
        out = module(q, k, v)
        torch.testing.assert_close(out, ref(q, k, v), atol=1e-5, rtol=0)
        failed = module.last_path
        fake_compile.flex_error = None  # compiling works again: the next call is compiled
        module(q, k, v)
        again = module.last_path
    assert failed.fallback is not None and "compile failed" in failed.fallback
    assert "graph break" in failed.fallback and failed.path == "flex_attention"
    assert again.fallback is None and again.path == "flex_attention(compiled)"


def test_a_block_mask_compile_failure_is_labelled_on_the_call_that_built_it(
        fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    q, k, v = _inputs(COMPILED_MASK_N)
    fake_compile.mask_error = RuntimeError("vectorised codegen rejected")
    with torch.no_grad():
        module(q, k, v)
        built = module.last_path
        module(q, k, v)  # the cached mask: nothing built eagerly in this call
        reused = module.last_path
    assert built.fallback is not None and built.fallback.startswith("block mask built eagerly")
    assert reused.fallback is None


def test_a_small_block_mask_is_built_without_its_compiled_call(fake_compile: FakeCompile) -> None:
    """Below EAGER_MASK_ELEMENTS (and without a key_mask) the compiled block-mask call is never
    made, so it cannot fail; past it, or with a key_mask, it is."""
    module = create_attention("sliding_window", window=4, kernel="flex")
    ref = create_attention("sliding_window", window=4, kernel="reference")
    fake_compile.mask_error = RuntimeError("the compiled block-mask call ran")
    small = _inputs(32)
    with torch.no_grad():
        torch.testing.assert_close(module(*small), ref(*small), atol=1e-5, rtol=0)
        assert module.last_path.fallback is None and module.last_path.setup_s is not None
        module(*small, key_mask=torch.ones(1, 32, dtype=torch.bool))
        assert "the compiled block-mask call ran" in (module.last_path.fallback or "")
        module(*_inputs(COMPILED_MASK_N))
        assert "the compiled block-mask call ran" in (module.last_path.fallback or "")


def test_flex_timings_synchronise_the_device(fake_compile: FakeCompile,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(flex, "synchronize", synced.append)
    module = create_attention("sliding_window", window=4, kernel="flex")
    q, k, v = _inputs()
    with torch.no_grad():
        module(q, k, v)  # first call of the shape: start, block mask built, compile end
    assert synced == [q.device] * 3


def test_synchronize_waits_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    flex.synchronize(torch.device("cpu"))
    assert calls == []
    flex.synchronize(torch.device("cuda", 1))
    assert calls == [torch.device("cuda", 1)]
