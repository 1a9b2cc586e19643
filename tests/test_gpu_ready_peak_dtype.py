"""A row's peak fraction divides by the matmul peak of the dtype its kernel
actually computes in: kernels that compute half inputs in float32 (``reference``, ``chunked``,
``blocked``) against the float32 peak, the others (``sdpa``, ``flex``, ``xformers``, and
Nystrom's own implementation, whose N-sized products run through SDPA in the input dtype)
against the peak of the input dtype."""

from __future__ import annotations

import pytest
import torch

from attn.registry import kernel_compute_dtype
from bench.speed import peak


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

    monkeypatch.setattr(peak, "_MEASURED", {})
    monkeypatch.setattr("bench.speed.rounds.measure_peak", fake_measure)
    spec = peak.PeakSpec("cpu", "bfloat16")
    blocked, flexed, failed = _row("blocked"), _row("flex"), dict(_row("blocked"), status="oom")
    peak.add_node_peak([blocked, flexed, failed], spec)
    assert blocked["peak_fraction"] == pytest.approx(0.5)  # 5 TFLOP/s of a 10 TFLOP/s fp32 peak
    assert flexed["peak_fraction"] == pytest.approx(0.05)  # of the 100 TFLOP/s bf16 peak
    assert "peak_fraction" not in failed and peak.PEAK_KEY not in failed
    assert blocked[peak.PEAK_KEY].split("/")[1] == "float32"  # each peak handed back by its key
    assert flexed[peak.PEAK_KEY].split("/")[1] == "bfloat16"
    assert sorted(measured) == ["bfloat16", "float32"]
    again = _row("chunked")
    peak.add_node_peak([again], spec)  # measured once per key in a process
    assert again["peak_fraction"] == pytest.approx(0.5) and len(measured) == 2


def test_a_float32_sweep_is_divided_by_its_own_peak_alone() -> None:
    assert peak.row_compute_dtype(_row("blocked", dtype="float32"), "float32") == "float32"
    assert peak.row_compute_dtype(_row("flex"), "bfloat16") == "bfloat16"
    assert peak.row_compute_dtype(_row("blocked"), "bfloat16") == "float32"
    assert peak.row_compute_dtype({"status": "ok"}, "bfloat16") == "bfloat16"  # no kernel named
