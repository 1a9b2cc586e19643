"""The matmul peak on a GPU is timed after its clocks are steady (a
time-based warm-up: at least a minimum time, and until two consecutive calls agree), and it
is cached per device name and dtype (see docs/gpu.md). A fake clock and a fake timer stand in
for a GPU whose clocks ramp up; fake device names for the devices."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

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
