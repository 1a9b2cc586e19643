"""The ``flex`` kernel: declared limits, exactness, compile time reported apart, no recompile-limit
fallback and no wrong output over a sweep of shapes, no reads past the inputs, compiled code shared
only between equally configured modules. CPU compiles take seconds, so the cases are few and small,
and marked ``compile`` (the full run's, not the default run's)."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from attn import AttentionCall, ExactAttention, MaskMod, create_attention, get_kernel, register_attention
from attn.kernels import flex
from attn.kernels.flex import ALIGN, BLOCK, key_bucket, padded_lengths
from attn.kernels.reference import dense_attention
from attn.oom import is_oom_error
from attn.registry import unregister_attention
from attn.variants.sliding_window import sliding_window_mod
from bench.engine.process import failure


def test_declared_limits_on_cpu() -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    reasons = module.not_supported_reasons(AttentionCall("cpu", torch.float32, False, True))
    assert any("backward" in r for r in reasons)
    assert any("float64" in r for r in module.not_supported_reasons(AttentionCall("cpu", torch.float64, False, False)))
    assert module.not_supported_reasons(AttentionCall("cpu", torch.float32, True, False)) == []
    with pytest.raises(NotImplementedError, match="backward"):
        q = torch.randn(1, 1, 8, 8, requires_grad=True)
        module(q, q, q)


@pytest.mark.compile
def test_matches_reference_with_key_mask_and_decoding_shape() -> None:
    module = create_attention("dilated", window=2, dilation=3, kernel="flex")
    ref = create_attention("dilated", window=2, dilation=3, kernel="reference")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 33, 16, generator=gen)
    k, v = torch.randn(2, 2, 70, 16, generator=gen), torch.randn(2, 2, 70, 16, generator=gen)
    key_mask = torch.rand(2, 70, generator=gen) > 0.3
    key_mask[1] = False  # rows with no key: zeros
    with torch.no_grad():
        out = module(q, k, v, causal=True, key_mask=key_mask)
        first = module.last_path
        torch.testing.assert_close(out, ref(q, k, v, causal=True, key_mask=key_mask),
                                   atol=1e-5, rtol=0)
        key_mask2 = torch.rand(2, 70, generator=gen) > 0.5  # new data, same shape: no recompile
        out = module(q, k, v, causal=True, key_mask=key_mask2)
        torch.testing.assert_close(out, ref(q, k, v, causal=True, key_mask=key_mask2),
                                   atol=1e-5, rtol=0)
    assert first.compile_s is not None and first.compile_s > 0 and first.fallback is None
    assert module.last_path.compile_s is None and module.last_path.fallback is None


def _in_nan_buffer(t: torch.Tensor, rows: int = 32) -> torch.Tensor:
    """``t (B, H, N, D)`` as a view into a buffer whose ``rows`` rows after N are NaN."""
    batch, heads, length, dim = t.shape
    buf = torch.full((batch, heads, length + rows, dim), float("nan"))
    buf[:, :, :length] = t
    return buf[:, :, :length]


@pytest.mark.slow
@pytest.mark.compile
def test_sweep_of_shapes_never_falls_back_to_eager() -> None:
    """More shapes than dynamo's recompile limit (8) on one module, inputs inside NaN-filled
    buffers: every output right (n = 24 is 8 past a multiple of 16), no eager fallback, compile
    time reported on every new shape, and lengths 17..25 share one compiled (padded) bucket."""
    module = create_attention("relative", bias="alibi", num_heads=1, kernel="flex")
    ref = create_attention("relative", bias="alibi", num_heads=1, kernel="reference")
    limit = getattr(torch._dynamo.config, "recompile_limit", 8)
    with torch.no_grad():
        for n in range(16, 16 + limit + 2):
            q = _in_nan_buffer(torch.randn(1, 1, n, 16))
            out = module(q, q, q)
            assert module.last_path.fallback is None, module.last_path.fallback
            assert module.last_path.compile_s is not None
            torch.testing.assert_close(out, ref(q, q, q), atol=1e-5, rtol=0)
    assert len(get_kernel("flex")._buckets_of(module.pattern())) == 2  # n = 16 as it is; 17..25 padded to 32


@pytest.mark.compile
def test_reads_nothing_past_the_keys_at_a_length_8_past_a_multiple_of_16() -> None:
    """Nk = 24, D = 16: torch's CPU template reads 8 keys past the end there unless padded."""
    module = create_attention("sliding_window", window=20, kernel="flex")
    ref = create_attention("sliding_window", window=20, kernel="reference")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (_in_nan_buffer(torch.randn(1, 2, 24, 16, generator=gen)) for _ in range(3))
    with torch.no_grad():
        out = module(q, k, v)
        torch.testing.assert_close(out, ref(q, k, v), atol=1e-5, rtol=0)
    assert module.last_path.fallback is None and out.shape == (1, 2, 24, 16)


class _Band(ExactAttention):
    """A plug-in-style band |i - j| <= width that keeps its width private and out of ``extra_repr``."""

    def __init__(self, width: int = 1, **common: Any) -> None:
        super().__init__(**common)
        self._width = width

    def mask_mod(self) -> MaskMod:
        width = self._width

        def band(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            return (i - j).abs() <= width

        return band

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"


@pytest.mark.compile
def test_plugin_instances_with_other_arguments_get_their_own_compiled_mask() -> None:
    register_attention("flex_test_band", overwrite=True)(_Band)
    try:
        narrow = create_attention("flex_test_band", width=1, kernel="flex")
        wide = create_attention("flex_test_band", width=6, kernel="flex")
        assert narrow.extra_repr() == wide.extra_repr()  # the repr cannot tell them apart
        same = create_attention("flex_test_band", width=1, kernel="flex")
        assert narrow.pattern().shared and narrow.pattern().key == same.pattern().key
        assert narrow.pattern().key != wide.pattern().key
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(3))
        with torch.no_grad():
            for module, width in ((narrow, 1), (wide, 6), (narrow, 1)):
                expected = dense_attention(q, k, v, mask_mod=sliding_window_mod(width))
                torch.testing.assert_close(module(q, k, v), expected, atol=1e-5, rtol=0)
                assert module.last_path.fallback is None
    finally:
        unregister_attention("flex_test_band")


def key(module: Any) -> Any:
    """The compile-cache key of ``module``'s pattern (None when it is kept per module)."""
    pattern = module.pattern()
    return pattern.key if pattern.shared else None


def test_cache_key_follows_arguments_and_attributes_not_copies() -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    assert key(copy.deepcopy(module)) == key(module)  # copies share compiled code
    assert key(create_attention("sliding_window", window=5, kernel="flex")) != key(module)
    before = key(module)
    module.window = 5  # changed after construction: no longer the configuration compiled before
    assert key(module) != before
    biased = create_attention("relative", bias="alibi", num_heads=2, kernel="flex")
    assert key(biased) is None  # its mods close over its tensors: identified by the module itself
    assert biased.pattern().key == biased.pattern().key  # stable from call to call
    assert biased.pattern().owner is biased.pattern().owner
    assert copy.deepcopy(biased).pattern().key != biased.pattern().key  # a copy has its own tensors


# Flex never hides an out-of-memory error as a compile failure: torch.compile is replaced by fakes
# whose compiled functions raise; an OOM propagates (an `oom` row), any other failure runs eager flex
# in that bucket and says so in KernelPath.fallback; a block mask is compiled only for a plug-in's
# arbitrary mask_mod.
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


# KV-cache decoding with flex compiles once per key-length bucket, not once per key length, on every
# device (the compile count with a counting stand-in for torch.compile; CUDA's buckets from padded_lengths).
def test_cuda_key_lengths_share_buckets_with_little_padding() -> None:
    cuda = torch.device("cuda")
    buckets = {padded_lengths(1, k, cuda)[1] for k in range(1024, 8193)}
    assert len(buckets) <= 25  # was 7169: one compile per decoding step
    for k in range(1, 9000, 7):
        k_pad = key_bucket(k, cuda)
        assert k_pad >= k and k_pad % BLOCK == 0 and k_pad - k < max(k / 8, BLOCK)
    assert padded_lengths(300, 1 << 14, cuda) == (300, 1 << 14)  # a power of two: no padding


def test_cpu_key_buckets_keep_the_micro_kernel_alignment() -> None:
    cpu = torch.device("cpu")
    for k in range(1, 5000, 3):
        k_pad = key_bucket(k, cpu)
        assert k_pad >= k and k_pad % ALIGN == 0 and k_pad - k < max(k / 8, ALIGN)
    assert len({key_bucket(k, cpu) for k in range(1024, 8193)}) <= 25  # was 449 (multiples of 16)


class CountingCompile:
    """``torch.compile`` for flex's own calls: counts them and runs the function uncompiled."""

    def __init__(self) -> None:
        self.flex_calls = 0

    def __call__(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        name = getattr(fn, "__name__", "")
        if not name.startswith(("flex_call", "block_mask_call")):
            return REAL_COMPILE(fn, **options)
        self.flex_calls += name.startswith("flex_call")
        return fn


def test_kv_cache_decoding_with_flex_compiles_once_per_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingCompile()
    monkeypatch.setattr(torch, "compile", counting)
    kernel = get_kernel("flex")
    monkeypatch.setattr(kernel, "_by_key", {})
    monkeypatch.setattr(kernel, "_by_owner", weakref.WeakKeyDictionary())
    module = create_attention("sliding_window", window=64, kernel="flex")
    ref = create_attention("sliding_window", window=64, kernel="reference")
    gen = torch.Generator().manual_seed(0)
    k_all, v_all = torch.randn(1, 2, 1300, 16, generator=gen), torch.randn(1, 2, 1300, 16, generator=gen)
    steps = range(1000, 1300, 3)
    with torch.no_grad():
        for k_len in steps:  # one new query over a growing cache, as a decoder step
            q = torch.randn(1, 2, 1, 16, generator=gen)
            out = module(q, k_all[:, :, :k_len], v_all[:, :, :k_len], causal=True)
            expected = ref(q, k_all[:, :, :k_len], v_all[:, :, :k_len], causal=True)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    buckets = {key_bucket(k, torch.device("cpu")) for k in steps}
    assert counting.flex_calls == len(buckets) <= 4  # multiples of 16: 19 compiles
