"""KV-cache decoding with flex compiles once per key-length *bucket*, not once
per key length, on every device (CUDA ran every call at its exact length: a compile per decoding
step), and ``attn-bench decoding --device`` runs and times the models on the device it names.

The compile count is taken on the CPU with ``torch.compile`` replaced by a counting stand-in
(no real compile: seconds each here); on CUDA the same buckets are read from
:func:`attn.kernels.flex.padded_lengths`, which decides them."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attn import create_attention, get_kernel
from attn.kernels.flex import ALIGN, BLOCK, key_bucket, padded_lengths
from bench.cli.app import app
from bench.decoding import benchmark
from bench.decoding.options import DecodingOptions

REAL_COMPILE = torch.compile


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


def test_decoding_options_take_a_device() -> None:
    assert DecodingOptions().device == "cpu"
    with pytest.raises(ValueError, match="--device.*allowed values are"):
        DecodingOptions(device="tpu")


def test_decoding_cli_device_option() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["decoding", "--device", "tpu"])
    assert bad.exit_code == 2 and "--device" in bad.output
    if not torch.cuda.is_available():
        no_gpu = runner.invoke(app, ["decoding", "--device", "cuda"])
        assert no_gpu.exit_code == 2 and "cuda" in no_gpu.output.lower()


def test_decoding_runs_and_times_on_the_device_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(benchmark, "synchronize", synced.append)
    moved: list[torch.device] = []
    real_to = torch.nn.Module.to

    def recording_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        moved.extend(a for a in args if isinstance(a, torch.device))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", recording_to)
    sizes = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, vocab_size=16)
    rows = benchmark.bench_decoding("full", {}, 24, 2, sizes, repeats=1, device="cpu")
    assert [r["device"] for r in rows] == ["cpu", "cpu"]
    assert torch.device("cpu") in moved
    assert synced and set(synced) == {torch.device("cpu")}  # each timing starts and ends synced


def test_timings_synchronise_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    benchmark.synchronize(torch.device("cpu"))
    assert calls == []
    benchmark.synchronize(torch.device("cuda"))
    assert calls == [torch.device("cuda")]
