"""The conformance kit must fail deliberately broken attentions, saying what is wrong."""

from __future__ import annotations

import weakref

import pytest
from torch import Tensor

from attn import Attention, ExactAttention, KernelPath, attention_info, create_attention, get_kernel
from attn.conformance import SWEEP_LENGTHS, check_attention
from attn.conformance.harness import (
    HEADS,
    QUICK_SHAPES,
    SHAPES,
    causal_options,
    enter_profile,
    iter_cases,
    leave_profile,
)
from attn.kernels import register_kernel
from attn.kernels.base import Kernel
from attn.kernels.reference import dense_attention
from attn.mods import MaskMod
from attn.pattern import Pattern, PatternOwner
from attn.variants.sliding_window import SlidingWindowAttention, sliding_window_mod


class LeaksFuture(ExactAttention):
    """Claims full attention with causal support but ignores ``causal`` (its own implementation,
    so it runs as kernel ``native`` only)."""

    name = "leaks_future"

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(q, k, v, key_mask=key_mask)


class IgnoresKeyMask(ExactAttention):
    """Full attention that forgets the padding mask."""

    name = "ignores_key_mask"

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(q, k, v, causal=causal)


class OffByOneWindow(SlidingWindowAttention):
    """Declares |i - j| <= w but computes |i - j| < w (the attention-gym vs torchtitan confusion)."""

    name = "off_by_one_window"
    example_params = ({"window": 3},)

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(
            q, k, v, mask_mod=sliding_window_mod(self.window - 1), causal=causal, key_mask=key_mask
        )


class MixesBatch(Attention):
    """A structural (no mask_mod) attention whose output depends on the other batch elements."""

    name = "mixes_batch"
    exact = False
    supports_causal = False

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        out = dense_attention(q, k, v, key_mask=key_mask)
        return out + out.mean(dim=0, keepdim=True) * 0.1


def failures_of(factory) -> list[str]:
    report = check_attention(factory)  # each runs as itself (kernel native): the kit checks that
    assert not report.passed
    return report.failures


def test_kit_catches_future_leakage() -> None:
    failures = failures_of(LeaksFuture)
    leak = [f for f in failures if "causal_no_leak" in f]
    assert leak and "future leakage" in leak[0] and "positions >" in leak[0]
    assert any("matches_reference" in f and "causal=True" in f for f in failures)


def test_kit_catches_ignored_key_mask() -> None:
    failures = failures_of(IgnoresKeyMask)
    masked = [f for f in failures if f.startswith("[FAIL] key_mask")]
    assert masked and "key_mask ignored" in masked[0]
    assert any("matches_reference" in f and "key_mask=yes" in f for f in failures)


def test_kit_names_the_off_by_one_window_pairs() -> None:
    failures = failures_of(OffByOneWindow)
    pattern = [f for f in failures if "[FAIL] pattern" in f]
    assert pattern, failures
    # the pairs at distance exactly w=3 are the ones the broken kernel drops
    assert "definition allows, kernel ignores it" in pattern[0]
    assert "(i=3, j=0" in pattern[0] or "(i=0, j=3" in pattern[0]


def test_kit_catches_batch_mixing() -> None:
    failures = failures_of(MixesBatch)
    assert any("batch_independence" in f and "depend on other batch elements" in f for f in failures)


class BandDisagreesWithMask(SlidingWindowAttention):
    """Its mask_mod says |i - j| < w while its band says |i - j| <= w: the pattern written twice,
    inconsistently (``blocked`` would compute the band, ``reference`` the mask)."""

    name = "band_disagrees_with_mask"
    example_params = ({"window": 3},)

    def mask_mod(self) -> MaskMod:
        return sliding_window_mod(self.window - 1)


def test_kit_catches_a_band_that_disagrees_with_the_mask() -> None:
    report = check_attention(BandDisagreesWithMask, kernels=["reference"])
    band = [f for f in report.failures if "band_matches_mask" in f]
    assert band, report.failures
    assert "differ at" in band[0] and "mask_mod forbids, band admits it" in band[0]
    assert "(i=3, j=0, head 0" in band[0] or "(i=0, j=3, head 0" in band[0]
    # the real variant's band and mask agree
    real = check_attention("sliding_window", params={"window": 3}, kernels=["reference"])
    assert [str(r) for r in real.results if r.check == "band_matches_mask"] == [
        "[PASS] band_matches_mask kernel=- params={'window': 3}"]


def test_correct_variant_passes_same_checks() -> None:
    """Control: the real sliding window with the same parameters passes (kernels that compile
    per shape are left to test_attn_conformance)."""
    kernels = [k for k in attention_info("sliding_window").kernels if not get_kernel(k).compiles_per_shape]
    assert check_attention("sliding_window", params={"window": 3}, kernels=kernels).passed


class CompilesPerShape(Kernel):
    """An exact kernel that declares a compilation per call shape (the kit then sweeps shapes)."""

    name = "exact_per_shape"
    compiles_per_shape = True

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        out = dense_attention(
            q, k, v, mask_mod=pattern.mask_mod, score_mod=pattern.score_mod,
            causal=causal, key_mask=key_mask,
        )
        return out, KernelPath(self.name, "dense")


class StaleAfterEightShapes(CompilesPerShape):
    """Right for the first 8 shapes a module runs, then wrong in its first rows: a compiled
    cache that serves stale code once dynamo's recompile limit is reached."""

    name = "stale_after_eight"

    def __init__(self) -> None:
        self._shapes: weakref.WeakKeyDictionary[PatternOwner, set[tuple]] = weakref.WeakKeyDictionary()

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        shapes = self._shapes.setdefault(pattern.owner, set())
        shapes.add((*q.shape, *k.shape))
        out, path = super().run(pattern, q, k, v, causal, key_mask)
        return (out + 1.0 if len(shapes) > 8 else out), path


class ReadsPastTheKeys(CompilesPerShape):
    """Reads 8 rows past the end of k when Nk is 8 past a multiple of 16 (as a 16-wide SIMD
    block would): its output depends on memory it does not own."""

    name = "reads_past_the_keys"

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        out, path = super().run(pattern, q, k, v, causal, key_mask)
        batch, heads, k_len, dim = k.shape
        if k_len % 16 == 8:
            past = k.as_strided((batch, heads, k_len + 8, dim), k.stride(), k.storage_offset())[:, :, k_len:]
            out = out + 0.0 * past.sum()  # NaN past the keys -> NaN everywhere
        return out, path


class WindowOnFakeKernels(SlidingWindowAttention):
    """The real sliding window, run on the fake compiled kernels above (which support it)."""

    name = "window_on_fake_kernels"
    example_params = ({"window": 3},)


@pytest.fixture
def fake_kernels() -> None:  # the autouse registries_restored fixture removes them
    for kernel in (CompilesPerShape, StaleAfterEightShapes, ReadsPastTheKeys):
        register_kernel(kernel)


def sweep_result(kernel: str) -> str:
    # in this process: the fake kernels are patched into this process's kernel table only
    report = check_attention(WindowOnFakeKernels, kernels=[kernel], quick=True, isolate=False)
    others = [f for f in report.failures if "shape_sweep" not in f]
    assert not others, others  # every other check passes: only the sweep sees the bug
    (result,) = [str(r) for r in report.results if r.check == "shape_sweep"]
    return result


def test_kit_catches_a_stale_compiled_shape_after_the_recompile_limit(fake_kernels: None) -> None:
    result = sweep_result("stale_after_eight")
    assert result.startswith("[FAIL]") and f"shape 9 of {len(SWEEP_LENGTHS)}" in result
    assert f"Nq={SWEEP_LENGTHS[8]} Nk={SWEEP_LENGTHS[8]}" in result


def test_kit_catches_reads_past_the_inputs(fake_kernels: None) -> None:
    result = sweep_result("reads_past_the_keys")
    index = SWEEP_LENGTHS.index(24) + 1
    assert result.startswith("[FAIL]") and f"shape {index} of {len(SWEEP_LENGTHS)}" in result
    assert "max |out - ref| = nan" in result and "Nk=24" in result


def test_exact_compiled_kernel_passes_the_sweep(fake_kernels: None) -> None:
    assert sweep_result("exact_per_shape").startswith("[PASS] shape_sweep")


class OffByOneBand(CompilesPerShape):
    """A compiled-style kernel whose band is one wider than the variant's: |i - j| <= w + 1
    where the sliding window declares |i - j| <= w (a wrong kernel, not a wrong variant)."""

    name = "off_by_one_band"

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        assert pattern.band is not None
        wider = sliding_window_mod(pattern.band.window + 1)
        out = dense_attention(q, k, v, mask_mod=wider, causal=causal, key_mask=key_mask)
        return out, KernelPath(self.name, "dense, band one too wide")


def test_quick_profile_catches_a_kernel_with_an_off_by_one_band() -> None:
    """The profile ``attn-bench check`` runs by default (quick) still fails a wrong kernel,
    naming the pairs, though a kernel that compiles per shape is probed at a kit shape."""
    register_kernel(OffByOneBand)
    report = check_attention(WindowOnFakeKernels, kernels=[OffByOneBand.name], quick=True, isolate=False)
    failed = {f.split("]", 1)[1].split()[0]: f for f in report.failures}
    assert {"matches_reference", "pattern", "shape_sweep"} <= set(failed), report.failures
    assert "definition forbids, kernel uses it" in failed["pattern"]
    assert "(i=0, j=4" in failed["pattern"] or "(i=4, j=0" in failed["pattern"]


class RecordsModules(CompilesPerShape):
    """An exact kernel that records which module copy (pattern owner) and dtype called it."""

    name = "records_modules"

    def __init__(self) -> None:
        self.seen: set[tuple[int, object]] = set()

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        self.seen.add((id(pattern.owner), q.dtype))
        return super().run(pattern, q, k, v, causal, key_mask)


def test_every_check_of_a_kernel_runs_one_module_copy_per_dtype() -> None:
    """A kernel caching compiled code per module (flex, for a learned bias) compiles once per
    kit run: all its checks call one copy of the module per dtype, not a copy per check."""
    kernel = get_kernel(register_kernel(RecordsModules).name)
    report = check_attention(WindowOnFakeKernels, kernels=[kernel.name], quick=True, isolate=False)
    assert report.passed, report.failures
    ran = {r.check for r in report.results if r.status == "pass"}
    assert {"shape_dtype_finite", "gradients", "pattern", "key_mask", "shape_sweep"} <= ran
    dtypes = [dtype for _, dtype in kernel.seen]
    # one copy per dtype, and the shape sweep its own (its lengths are the first that copy runs)
    assert sorted(map(str, dtypes)) == ["torch.float32", "torch.float64", "torch.float64"], kernel.seen


@pytest.mark.parametrize("variant", ["sliding_window", "nystrom"])  # causal or not; non-causal only
def test_quick_profile_runs_every_case_combination_once_and_each_value_on_each_shape(variant: str) -> None:
    """The quick profile runs each (causal, key_mask) combination on one of its two shapes
    (half the compiles of a kernel that compiles per case); the full one on every shape."""
    module = create_attention(variant, num_heads=HEADS, head_dim=16)
    combos = {(causal, masked) for causal in causal_options(module) for masked in (False, True)}
    profile = enter_profile(quick=True)
    try:
        cases = [(shape, causal, key_mask is not None) for shape, causal, key_mask in iter_cases(module, "cpu")]
    finally:
        leave_profile(profile)
    assert sorted((c, m) for _, c, m in cases) == sorted(combos)  # each combination exactly once
    for shape in QUICK_SHAPES:
        on_shape = [(c, m) for s, c, m in cases if s == shape]
        if len(combos) == 4:  # causal and not: each shape runs both values of each flag
            assert {c for c, _ in on_shape} == {m for _, m in on_shape} == {False, True}
        else:  # one causal option: one combination per shape
            assert len(on_shape) == 1
    full = [(shape, causal, key_mask is not None) for shape, causal, key_mask in iter_cases(module, "cpu")]
    assert len(full) == len(SHAPES) * len(combos)


class RecordsGroupedCalls(Kernel):
    """An exact kernel (no compile) that records (key/value heads, causal, key_mask given)."""

    name = "records_grouped_calls"

    def __init__(self) -> None:
        self.seen: set[tuple[int, bool, bool]] = set()

    def run(self, pattern: Pattern, q, k, v, causal, key_mask) -> tuple[Tensor, KernelPath]:
        self.seen.add((k.shape[1], bool(causal), key_mask is not None))
        out = dense_attention(q, k.repeat_interleave(q.shape[1] // k.shape[1], dim=1),
                              v.repeat_interleave(q.shape[1] // v.shape[1], dim=1),
                              mask_mod=pattern.mask_mod, score_mod=pattern.score_mod,
                              causal=causal, key_mask=key_mask)
        return out, KernelPath(self.name, "dense")


def test_grouped_query_meets_every_case_pair_with_gqa_and_with_mqa() -> None:
    """The full kit's grouped_query check calls GQA (2 of 4 heads) and MQA (1) each with every
    (causal, key_mask) pair somewhere across its shapes."""
    kernel = get_kernel(register_kernel(RecordsGroupedCalls).name)
    report = check_attention(WindowOnFakeKernels, kernels=[kernel.name], isolate=False)
    assert report.passed, report.failures
    pairs = {(causal, masked) for causal in (False, True) for masked in (False, True)}
    for kv_heads in (HEADS // 2, 1):
        assert {(c, m) for h, c, m in kernel.seen if h == kv_heads} == pairs, (kv_heads, kernel.seen)
