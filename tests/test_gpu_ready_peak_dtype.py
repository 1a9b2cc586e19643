"""Issue 27 item 8: a row's peak fraction divides by the matmul peak of the dtype its kernel
actually computes in: kernels that compute half inputs in float32 (``reference``, ``chunked``,
``blocked``, Nystrom's own implementation) against the float32 peak, the others (``sdpa``,
``flex``, ``xformers``) against the peak of the input dtype."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attn.registry import kernel_compute_dtype
from bench.speed import sweep
from bench.speed.rows import peak_fraction


@pytest.mark.parametrize(("variant", "kernel", "computes"), [
    ("sliding_window", "blocked", torch.float32),
    ("relative", "chunked", torch.float32),
    ("full", "reference", torch.float32),
    ("nystrom", "native", torch.float32),
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


def test_peak_fraction_uses_the_peak_of_the_compute_dtype() -> None:
    peaks = {"bfloat16": 100e12, "float32": 10e12}
    blocked, flexed = _row("blocked"), _row("flex")
    peak_fraction(blocked, sweep.row_peak(blocked, peaks), "here")
    peak_fraction(flexed, sweep.row_peak(flexed, peaks), "here")
    assert blocked["peak_fraction"] == pytest.approx(0.5)  # 5 TFLOP/s of a 10 TFLOP/s fp32 peak
    assert flexed["peak_fraction"] == pytest.approx(0.05)  # of the 100 TFLOP/s bf16 peak
    fp32_row = _row("blocked", dtype="float32")
    assert sweep.row_peak(fp32_row, {"float32": 7.0}) == 7.0
    assert math.isnan(sweep.row_peak(_row("blocked"), {"bfloat16": 1.0}))  # no fp32 peak: none


def test_a_half_sweep_measures_the_float32_peak_too(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[str] = []

    def fake_measure(device: str, dtype: str, threads: int | None, size: int | None) -> float:
        measured.append(dtype)
        return {"bfloat16": 100e12, "float32": 10e12}[dtype]

    monkeypatch.setattr(sweep, "measure_peak", fake_measure)
    config = SimpleNamespace(device="cuda", dtype="bfloat16", threads=None, peak_matmul_size=None)
    plan = SimpleNamespace(config=config)
    apply = sweep.SweepPlan.begin(plan, tmp_path, {"hostname": "here"})  # type: ignore[arg-type]
    row = _row("blocked")
    apply(row)
    assert sorted(measured) == ["bfloat16", "float32"]
    assert row["peak_fraction"] == pytest.approx(0.5)
    apply(second := _row("sdpa"))
    assert second["peak_fraction"] == pytest.approx(0.05)
    assert sweep.matmul_peak(tmp_path, config, "float32") == 10e12 and len(measured) == 2  # cached
