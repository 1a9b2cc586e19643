"""The memory model counts a mask's build as it peaks: the int64 temporaries of its index
arithmetic, measured on a small grid, scale with N^2 and agree with torch's own profiler."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attn.kernels import get_kernel
from attn.mods import dense_allowed
from attn.pattern import Pattern
from bench.runner import load_run
from bench.speed.cases import expand_cases
from bench.speed.config import parse_config
from bench.speed.memory import PROFILE_SIDE, USABLE, GiB, _LiveBytes, build_bytes, estimate_bytes, fits, pattern_of

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


# Presets that fit an 80 GB GPU: scaling-gpu caps each kernel's lengths by the memory model, so its dry
# run lists no case that cannot fit; quality-lra-gpu is the lra grid on CUDA (docs/gpu.md).
ROOT = Path(__file__).resolve().parents[1]


LIMIT = 80 * GiB


def _estimate(case) -> float:
    return estimate_bytes(pattern_of(case.variant, case.params_dict, case.heads, case.head_dim),
                          case.kernel, n=case.seq_len, batch=case.batch, heads=case.heads,
                          head_dim=case.head_dim, dtype=case.dtype, device=case.device,
                          passes=case.passes, params=case.params_dict, causal=case.causal)


@pytest.fixture(scope="module")
def gpu_cases():
    config = load_run("scaling-gpu")
    assert config.device_memory_gb == 80
    return config, expand_cases(config)


def test_no_scaling_gpu_case_exceeds_80_gb(gpu_cases):
    _, cases = gpu_cases
    over = [c.describe() for c in cases if _estimate(c) > USABLE * LIMIT]
    assert not over, over[:5]
    # independent of the model's constants: the N x N tensors alone
    for case in cases:
        n2 = case.seq_len ** 2
        if case.kernel == "reference":  # float32 scores and probabilities
            assert 2 * 4 * case.batch * case.heads * n2 < LIMIT, case.describe()
        if case.kernel == "sdpa" and case.variant not in ("full", "causal"):
            assert 8 * n2 < LIMIT, case.describe()  # the int64 (1, 1, N, N) grid


def test_no_scaling_gpu_case_twice_and_auto_beside_all(gpu_cases):
    config, cases = gpu_cases
    keys = Counter((c.variant, c.params, c.kernel, c.seq_len) for c in cases)
    assert not [k for k, count in keys.items() if count > 1]
    assert len({c.case_id for c in cases}) == len(cases)
    for spec in config.variants:
        kernels = {c.kernel for c in cases if c.variant == spec.name and c.params == spec.params}
        assert "auto" in kernels and len(kernels) >= 2, (spec.name, kernels)


def test_the_caps_are_per_kernel(gpu_cases):
    _, cases = gpu_cases
    longest: dict[tuple[str, str], int] = {}
    for c in cases:
        longest[c.variant, c.kernel] = max(longest.get((c.variant, c.kernel), 0), c.seq_len)
    assert longest["full", "reference"] < 65536  # N x N float32 scores
    assert longest["sliding_window", "sdpa"] <= 65536  # a materialised mask
    assert longest["full", "sdpa"] == 524288  # fused: O(N)
    assert longest["sliding_window", "flex"] == 524288
    assert longest["nystrom", "native"] == 524288
    assert longest["full", "auto"] == 524288


def test_without_a_device_memory_every_case_is_kept():
    raw = {"name": "t", "device": "cuda", "seq_len": [1024, 1048576],
           "variants": [{"name": "sliding_window", "kernels": ["sdpa"]}]}  # a materialised mask
    assert len(expand_cases(parse_config(raw))) == 2
    assert len(expand_cases(parse_config({**raw, "device_memory_gb": 80}))) == 1


def test_fits_uses_the_usable_share():
    assert fits(USABLE * LIMIT, 80) and not fits(USABLE * LIMIT + 1, 80)


def _dry_run(*args: str, tmp_path: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", *args, "--dry-run",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # 10 s (two CLI processes); the presets' cases are checked without the CLI in the default run
def test_the_cli_dry_runs_of_the_gpu_presets(tmp_path):
    speed = _dry_run("scaling-gpu", tmp_path=tmp_path)
    lines = [line for line in speed.splitlines() if " todo " in line]
    assert len(lines) == len(expand_cases(load_run("scaling-gpu")))
    assert any("[auto]" in line for line in lines)
    assert not any("[reference] N=65536" in line for line in lines)
    quality = _dry_run("quality-lra-gpu", tmp_path=tmp_path)
    assert "train listops full seed 0 (lra)" in quality
    grid = load_run("quality-lra-gpu")
    assert grid.device == "cuda" and grid.preset == "lra" and grid.timeout_s >= 12 * 3600


def test_the_acceptance_presets_hold_the_row_of_every_goal():
    """``acceptance-gpu`` and ``acceptance-gpu-flex`` (run by ``.ci/gpu-acceptance``) list each
    row docs/gpu.md reads a goal from: full and causal through SDPA at N >= 8K, Nystrom with
    64 landmarks and SDPA's full attention at 16K, the sliding window through flex with its
    forward pass first; all bf16 on CUDA, every case within the device's memory."""
    have = set()
    for name in ("acceptance-gpu", "acceptance-gpu-flex"):
        config = load_run(name)
        assert config.device == "cuda" and config.dtype == "bfloat16"
        for case in expand_cases(config):
            assert case.passes[-1] == "fwd_bwd" and case.seq_len >= 8192
            assert fits(_estimate(case), config.device_memory_gb)
            have.add((case.variant, case.kernel, case.seq_len, case.params_dict.get("num_landmarks"),
                      case.passes))
    for variant in ("full", "causal"):
        assert {(variant, kernel, 16384, None, ("fwd_bwd",)) for kernel in ("auto", "sdpa")} <= have
    assert ("nystrom", "native", 16384, 64, ("fwd_bwd",)) in have
    assert ("sliding_window", "flex", 16384, None, ("fwd", "fwd_bwd")) in have


def test_the_gpu_preset_lists_no_cpu_written_kernel_past_its_fair_length(gpu_cases):
    _, cases = gpu_cases
    longest = {kernel: max(c.seq_len for c in cases if c.kernel == kernel) for kernel in {c.kernel for c in cases}}
    for kernel in ("reference", "chunked", "blocked"):
        assert longest[kernel] <= get_kernel(kernel).CUDA_MAX_KEYS, (kernel, longest[kernel])
    assert max(longest.values()) > 65_536  # the GPU's own kernels still run to the longest lengths
