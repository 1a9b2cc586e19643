"""The conformance kit must fail deliberately broken attentions, saying what is wrong."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from attn import Attention, ExactAttention, attention_info, get_kernel
from attn.conformance import check_attention
from attn.kernels.reference import dense_attention
from attn.variants.sliding_window import SlidingWindowAttention, sliding_window_mod


class LeaksFuture(ExactAttention):
    """Claims full attention with causal support but ignores ``causal``."""

    name = "leaks_future"
    kernels: ClassVar[tuple[str, ...]] = ("native",)

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(q, k, v, key_mask=key_mask)


class IgnoresKeyMask(ExactAttention):
    """Full attention that forgets the padding mask."""

    name = "ignores_key_mask"
    kernels: ClassVar[tuple[str, ...]] = ("native",)

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(q, k, v, causal=causal)


class OffByOneWindow(SlidingWindowAttention):
    """Declares |i - j| <= w but computes |i - j| < w (the attention-gym vs torchtitan confusion)."""

    name = "off_by_one_window"
    kernels: ClassVar[tuple[str, ...]] = ("native",)
    example_params = ({"window": 3},)

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        return dense_attention(
            q, k, v, mask_mod=sliding_window_mod(self.window - 1), causal=causal, key_mask=key_mask
        )


class MixesBatch(Attention):
    """A structural (no mask_mod) attention whose output depends on the other batch elements."""

    name = "mixes_batch"
    kernels: ClassVar[tuple[str, ...]] = ("native",)
    exact = False
    supports_causal = False

    def native_forward(self, q, k, v, causal, key_mask) -> Tensor:
        out = dense_attention(q, k, v, key_mask=key_mask)
        return out + out.mean(dim=0, keepdim=True) * 0.1


def failures_of(factory) -> list[str]:
    report = check_attention(factory)
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


def test_correct_variant_passes_same_checks() -> None:
    """Control: the real sliding window with the same parameters passes (kernels that compile
    per shape are left to test_attn_conformance)."""
    kernels = [k for k in attention_info("sliding_window").kernels if not get_kernel(k).compiles_per_shape]
    assert check_attention("sliding_window", params={"window": 3}, kernels=kernels).passed
