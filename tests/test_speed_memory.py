"""The memory model counts a mask's build as it peaks: the int64 temporaries of its index
arithmetic, measured on a small grid, scale with N^2 and agree with torch's own profiler."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attn.mods import dense_allowed
from attn.pattern import Pattern
from bench.speed.memory import PROFILE_SIDE, _LiveBytes, build_bytes, estimate_bytes, pattern_of

CASES = [("sliding_window", {"window": 16}), ("dilated", {"window": 16, "dilation": [1, 2, 4, 8]}),
         ("global_tokens", {"num_global": 4, "window": 16}), ("causal", {})]


def _build(pattern: Pattern, side: int, causal: bool) -> None:
    dense_allowed(pattern.mask_mod, batch=1, heads=4, q_len=side, k_len=side, causal=causal,
                  key_mask=None, device=torch.device("cpu"))


def test_a_window_build_holds_two_int64_grids_at_its_peak() -> None:
    pattern = Pattern("window", mask_mod=lambda b, h, i, j: (i - j).abs() <= 3)
    # i - j and its abs are alive together (16 bytes a pair); the bool comes after the first is gone
    n = 4096
    assert 16.0 * n**2 <= build_bytes(pattern, 4, False, n) < 16.1 * n**2


@pytest.mark.parametrize(("name", "params"), CASES)
def test_the_counted_peak_agrees_with_the_profiler_and_scales_with_n_squared(name, params) -> None:
    pattern = pattern_of(name, params, 4, 16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _build(pattern, PROFILE_SIDE, True)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    assert build_bytes(pattern, 4, True, PROFILE_SIDE) == pytest.approx(peak, rel=0.01)
    for side in (3 * PROFILE_SIDE, 4 * PROFILE_SIDE):
        with _LiveBytes() as counter:
            _build(pattern, side, True)
        assert build_bytes(pattern, 4, True, side) == pytest.approx(counter.peak, rel=0.01)


def test_a_masked_sdpa_case_is_estimated_above_its_measured_mask_build() -> None:
    n, heads = 2048, 4
    pattern = pattern_of("dilated", {"window": 16, "dilation": [1, 2, 4, 8]}, heads, 16)
    with _LiveBytes() as counter:
        _build(pattern, n, False)
    estimate = estimate_bytes(pattern, "sdpa", n=n, batch=1, heads=heads, head_dim=16, dtype="float32",
                              device="cpu", passes=("fwd",), params={})
    assert counter.peak > 40 * heads * n**2 / 4  # per-head planes of int64: not the 9 bytes once assumed
    assert estimate > counter.peak


def test_per_head_planes_are_counted_on_a_few_heads_and_scaled() -> None:
    pattern = pattern_of("dilated", {"window": 16, "dilation": [1, 2, 4, 8]}, 16, 16)
    with _LiveBytes() as counter:
        dense_allowed(pattern.mask_mod, batch=1, heads=16, q_len=512, k_len=512, causal=False,
                      key_mask=None, device=torch.device("cpu"))
    assert build_bytes(pattern, 16, False, 512) == pytest.approx(counter.peak, rel=0.02)
