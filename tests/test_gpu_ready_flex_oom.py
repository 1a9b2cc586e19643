"""Flex never hides an out-of-memory error as a compile failure.

``torch.compile`` is replaced by fakes (no real compile: seconds each on this CPU) whose
compiled functions raise ``torch.OutOfMemoryError`` or another error: an OOM propagates (the
benchmark's row is ``oom``), any other failure runs eager flex from then on in that bucket and
says so in ``KernelPath.fallback`` of every call; the timings synchronise the device on CUDA. A
block mask is compiled only for a plug-in's arbitrary mask_mod (a band is read from its
structure, ``attn.kernels.block_masks``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from attn import ExactAttention, create_attention, get_kernel, register_attention
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


class _PluginBand(ExactAttention):
    """A plug-in's band, written as a mask_mod only (no declared ``Band``): its block mask is
    built by ``create_block_mask``, compiled past ``flex.EAGER_MASK_ELEMENTS``."""

    def mask_mod(self):
        return lambda b, h, i, j: (i - j).abs() <= 4


@pytest.fixture
def plugin_band() -> str:
    register_attention("flex_oom_plugin_band")(_PluginBand)  # the registry fixture removes it
    return "flex_oom_plugin_band"


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


def test_oom_while_building_the_block_mask_propagates(fake_compile: FakeCompile, plugin_band: str) -> None:
    module = create_attention(plugin_band, kernel="flex")
    q, k, v = _inputs(COMPILED_MASK_N)
    fake_compile.mask_error = _oom()
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError):
        module(q, k, v)


def test_a_compile_failure_is_remembered_per_bucket_and_labelled_on_every_call(
        fake_compile: FakeCompile) -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    ref = create_attention("sliding_window", window=4, kernel="reference")
    q, k, v = _inputs()
    fake_compile.flex_error = RuntimeError("graph break in a mask_mod")
    with torch.no_grad():
        out = module(q, k, v)
        torch.testing.assert_close(out, ref(q, k, v), atol=1e-5, rtol=0)
        failed = module.last_path
        fake_compile.flex_error = None  # the failing compile is not paid again in this bucket:
        torch.testing.assert_close(module(q, k, v), out)
        again = module.last_path
        other = _inputs(48)  # another shape is another bucket: compiled
        module(*other)
        elsewhere = module.last_path
    assert failed.fallback is not None and "compile failed" in failed.fallback
    assert "graph break" in failed.fallback and failed.path == "flex_attention"
    assert again.fallback == failed.fallback and again.path == "flex_attention"
    assert elsewhere.fallback is None and elsewhere.path == "flex_attention(compiled)"


def test_a_block_mask_compile_failure_is_labelled_on_the_call_that_built_it(
        fake_compile: FakeCompile, plugin_band: str) -> None:
    module = create_attention(plugin_band, kernel="flex")
    q, k, v = _inputs(COMPILED_MASK_N)
    fake_compile.mask_error = RuntimeError("vectorised codegen rejected")
    with torch.no_grad():
        module(q, k, v)
        built = module.last_path
        module(q, k, v)  # the cached mask: nothing built eagerly in this call
        reused = module.last_path
    assert built.fallback is not None and built.fallback.startswith("block mask built eagerly")
    assert reused.fallback is None


def test_a_small_block_mask_is_built_without_its_compiled_call(fake_compile: FakeCompile,
                                                                plugin_band: str) -> None:
    """Below EAGER_MASK_ELEMENTS (and without a key_mask) the compiled block-mask call is never
    made, so it cannot fail; past it, or with a key_mask, it is."""
    module = create_attention(plugin_band, kernel="flex")
    ref = create_attention(plugin_band, kernel="reference")
    fake_compile.mask_error = RuntimeError("the compiled block-mask call ran")
    small = _inputs(32)
    with torch.no_grad():
        torch.testing.assert_close(module(*small), ref(*small), atol=1e-5, rtol=0)
        assert module.last_path.fallback is None and module.last_path.setup_s is not None
        module(*small, key_mask=torch.ones(1, 32, dtype=torch.bool))
        assert "the compiled block-mask call ran" in (module.last_path.fallback or "")
        module(*_inputs(COMPILED_MASK_N))
        assert "the compiled block-mask call ran" in (module.last_path.fallback or "")


def test_a_band_never_calls_the_compiled_block_mask(fake_compile: FakeCompile) -> None:
    """Banded, factorised and unmasked patterns read their block mask from their structure:
    no compiled ``create_block_mask`` at any length or with a key_mask, one mask per shape."""
    fake_compile.mask_error = RuntimeError("the compiled block-mask call ran")
    for name, params in (("sliding_window", {"window": 4}), ("global_tokens", {"window": 4, "num_global": 2}),
                         ("dilated", {"window": 3, "dilation": 2}), ("causal", {}),
                         ("factorised", {"axis": "temporal", "positions_per_frame": 8})):
        module = create_attention(name, kernel="flex", **params)
        ref = create_attention(name, kernel="reference", **params)
        q, k, v = _inputs(COMPILED_MASK_N)
        key_mask = torch.arange(COMPILED_MASK_N).lt(COMPILED_MASK_N - 5).unsqueeze(0)  # (1, N)
        with torch.no_grad():
            torch.testing.assert_close(module(q, k, v), ref(q, k, v), atol=1e-5, rtol=0)
            assert module.last_path.fallback is None and module.last_path.setup_s is not None, name
            out = module(q, k, v, key_mask=key_mask)
            torch.testing.assert_close(out, ref(q, k, v, key_mask=key_mask), atol=1e-5, rtol=0)
            assert module.last_path.fallback is None, name
            module(q, k, v, key_mask=key_mask)
            assert module.last_path.setup_s is None, name  # the data-free mask is kept


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
