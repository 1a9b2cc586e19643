"""The matmul peak on a GPU is timed after its clocks are steady (a
time-based warm-up: at least a minimum time, and until two consecutive calls agree), and it
is cached per device name and dtype (see docs/gpu.md). A fake clock and a fake timer stand in
for a GPU whose clocks ramp up; fake device names for the devices."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attn.registry import kernel_compute_dtype
from bench.engine import measure
from bench.engine.measure import WarmUp, matmul_peak_flops, steady_warmup
from bench.speed import peak as peak_module
from bench.speed.peak import PeakSpec, node_peak, peak_key

STEADY_S = 0.005


class _RampingGpu:
    """A device whose calls take 10 ms cold and, as its clocks ramp up over 1.5 s of load,
    5 ms from then on, on a fake clock that each call advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time_once(self) -> float:
        seconds = STEADY_S * (1 + max(0.0, 1 - self.now / 1.5))
        self.now += seconds
        return seconds


def test_the_warm_up_waits_for_steady_clocks_not_one_call(monkeypatch):
    gpu = _RampingGpu()
    monkeypatch.setattr(measure, "time", SimpleNamespace(monotonic=gpu.monotonic,
                                                         perf_counter=gpu.monotonic))
    medians = steady_warmup(gpu.time_once, WarmUp(min_s=0.5, max_s=30.0))
    assert gpu.now >= 1.5 and medians[-1] == medians[-2] == STEADY_S


def test_the_warm_up_stops_at_its_limit(monkeypatch):
    gpu = _RampingGpu()
    monkeypatch.setattr(measure, "time", SimpleNamespace(monotonic=gpu.monotonic,
                                                         perf_counter=gpu.monotonic))
    steady_warmup(gpu.time_once, WarmUp(min_s=0.5, max_s=0.2))
    assert 0.2 <= gpu.now < 0.3


def test_the_peak_is_the_steady_clocks_peak(monkeypatch):
    gpu = _RampingGpu()
    monkeypatch.setattr(measure, "time", SimpleNamespace(monotonic=gpu.monotonic,
                                                         perf_counter=gpu.monotonic))

    class Timer:
        def __init__(self, *args: object) -> None:
            pass

        def time_once(self) -> float:
            return gpu.time_once()

    monkeypatch.setattr(measure, "CallTimer", Timer)
    flops = matmul_peak_flops(torch.device("cpu"), torch.float32, size=8,
                              warm_up=WarmUp(min_s=0.5, max_s=30.0))
    assert flops == pytest.approx(2 * 8**3 / STEADY_S)  # one warm-up call: about 0.5x


def test_the_peak_is_cached_per_device_name_and_dtype(monkeypatch):
    names = iter(["NVIDIA H100 80GB HBM3"] * 3 + ["NVIDIA A100-SXM4-80GB"] * 2)
    monkeypatch.setattr(peak_module, "device_name", lambda device: next(names))
    monkeypatch.setattr(peak_module, "_MEASURED", {})
    measured: list[tuple] = []

    def measure_peak(device: str, dtype: str, *rest: object) -> float:
        measured.append((device, dtype))
        return 1e15 if dtype == "bfloat16" else 5e14

    bf16, fp32 = PeakSpec("cuda", "bfloat16"), PeakSpec("cuda", "float32")
    keys = [node_peak(spec, measure=measure_peak)[0] for spec in (bf16, bf16, fp32, bf16, bf16)]
    assert keys == ["NVIDIA H100 80GB HBM3/bfloat16/default/matmuldefault"] * 2 + [
        "NVIDIA H100 80GB HBM3/float32/default/matmuldefault"] + [
        "NVIDIA A100-SXM4-80GB/bfloat16/default/matmuldefault"] * 2
    assert measured == [("cuda", "bfloat16"), ("cuda", "float32"), ("cuda", "bfloat16")]


def test_a_peak_the_driver_knows_is_not_measured_again(monkeypatch):
    monkeypatch.setattr(peak_module, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(peak_module, "_MEASURED", {})
    spec = PeakSpec("cuda", "bfloat16", threads=None, size=None)
    known = PeakSpec("cuda", "bfloat16", known=((peak_key("NVIDIA H100 80GB HBM3", spec), 7e14),))

    def refuse(*args: object) -> float:
        raise AssertionError("measured a known peak")

    assert node_peak(known, measure=refuse)[1] == 7e14


def test_a_failed_measurement_is_not_cached(monkeypatch):
    monkeypatch.setattr(peak_module, "device_name", lambda device: "gpu")
    monkeypatch.setattr(peak_module, "_MEASURED", {})
    values = iter([float("nan"), 1e15])
    spec = PeakSpec("cuda", "bfloat16")
    first = node_peak(spec, measure=lambda *a: next(values))[1]
    assert first != first  # NaN
    assert node_peak(spec, measure=lambda *a: next(values))[1] == 1e15


# A row's peak fraction divides by the matmul peak of the dtype its kernel computes in: float32 for
# kernels that compute half inputs in float32 (reference, chunked, blocked), the input dtype otherwise.
@pytest.mark.parametrize(("variant", "kernel", "computes"), [
    ("sliding_window", "blocked", torch.float32),
    ("relative", "chunked", torch.float32),
    ("full", "reference", torch.float32),
    ("nystrom", "native", torch.bfloat16),  # its m x m pseudo-inverse alone is float32
    ("sliding_window", "sdpa", torch.bfloat16),
    ("sliding_window", "flex", torch.bfloat16),
    ("causal", "xformers", torch.bfloat16),
])
def test_kernels_declare_the_dtype_they_compute_half_inputs_in(
        variant: str, kernel: str, computes: torch.dtype) -> None:
    assert kernel_compute_dtype(variant, kernel, torch.bfloat16) == computes
    assert kernel_compute_dtype(variant, kernel, torch.float32) == torch.float32
    assert kernel_compute_dtype(variant, kernel, torch.float64) == torch.float64


def test_unknown_variant_or_kernel_keeps_the_input_dtype() -> None:
    assert kernel_compute_dtype("no_such_variant", "blocked", torch.bfloat16) == torch.bfloat16
    assert kernel_compute_dtype("full", "no_such_kernel", torch.bfloat16) == torch.bfloat16


def _row(kernel: str, variant: str = "sliding_window", dtype: str = "bfloat16") -> dict:
    return {"status": "ok", "tflops": 5.0, "kernel": kernel, "variant": variant, "dtype": dtype,
            "hostname": "here"}


def test_peak_fraction_uses_the_peak_of_the_compute_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[str] = []

    def fake_measure(device, dtype, threads, size, cuda_visible) -> float:
        measured.append(dtype)
        return {"bfloat16": 100e12, "float32": 10e12}[dtype]

    monkeypatch.setattr(peak_module, "_MEASURED", {})
    monkeypatch.setattr("bench.speed.rounds.measure_peak", fake_measure)
    spec = peak_module.PeakSpec("cpu", "bfloat16")
    blocked, flexed, failed = _row("blocked"), _row("flex"), dict(_row("blocked"), status="oom")
    peak_module.add_node_peak([blocked, flexed, failed], spec)
    assert blocked["peak_fraction"] == pytest.approx(0.5)  # 5 TFLOP/s of a 10 TFLOP/s fp32 peak
    assert flexed["peak_fraction"] == pytest.approx(0.05)  # of the 100 TFLOP/s bf16 peak
    assert "peak_fraction" not in failed and peak_module.PEAK_KEY not in failed
    assert blocked[peak_module.PEAK_KEY].split("/")[1] == "float32"  # each peak handed back by its key
    assert flexed[peak_module.PEAK_KEY].split("/")[1] == "bfloat16"
    assert sorted(measured) == ["bfloat16", "float32"]
    again = _row("chunked")
    peak_module.add_node_peak([again], spec)  # measured once per key in a process
    assert again["peak_fraction"] == pytest.approx(0.5) and len(measured) == 2


def test_a_float32_sweep_is_divided_by_its_own_peak_alone() -> None:
    assert peak_module.row_compute_dtype(_row("blocked", dtype="float32"), "float32") == "float32"
    assert peak_module.row_compute_dtype(_row("flex"), "bfloat16") == "bfloat16"
    assert peak_module.row_compute_dtype(_row("blocked"), "bfloat16") == "float32"
    assert peak_module.row_compute_dtype({"status": "ok"}, "bfloat16") == "bfloat16"  # no kernel named
