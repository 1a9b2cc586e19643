"""The conformance kit checks bfloat16 and float16 (the dtypes a GPU sweep
times) against the float64 reference with per-dtype tolerances, and kernels whose support
depends on the dtype declare it from the call (xformers' cutlass-only float32 windows)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from attn import AttentionCall, ExactAttention, create_attention, get_kernel
from attn.conformance import ATOL, GRAD_ATOL, LOW_PRECISION_DTYPES, check_attention
from attn.kernels.reference import dense_attention
from attn.variants.sliding_window import sliding_window_mod
from bench.cli.app import app


class WrongInBfloat16(ExactAttention):
    """A window of 3 that is right in float64/float32 but, like a low-precision-only code path
    gone wrong, drops the outermost key on each side in bfloat16."""

    name = "wrong_in_bfloat16"
    example_params = ({},)

    def mask_mod(self):
        return sliding_window_mod(3)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                       key_mask: Tensor | None) -> Tensor:
        window = 2 if q.dtype == torch.bfloat16 else 3
        return dense_attention(q, k, v, mask_mod=sliding_window_mod(window), causal=causal,
                               key_mask=key_mask)  # (B, H, Nq, Dv)


def test_low_precision_dtypes_have_their_own_tolerances() -> None:
    for dtype in LOW_PRECISION_DTYPES:
        assert ATOL[torch.float32] < ATOL[dtype] < 0.1
        assert GRAD_ATOL[torch.float32] < GRAD_ATOL[dtype]


def test_kit_fails_a_variant_wrong_only_in_bfloat16() -> None:
    assert check_attention(WrongInBfloat16, isolate=False).passed  # float64 / float32: right
    report = check_attention(WrongInBfloat16, dtypes=("bfloat16",), isolate=False)
    failed = {r.check for r in report.results if r.status == "fail"}
    assert {"matches_reference", "pattern"} <= failed
    (match,) = [f for f in report.failures if "matches_reference" in f]
    assert "bfloat16" in match and "atol 0.04" in match


@pytest.mark.parametrize(("dtype", "kernels"), [
    pytest.param("bfloat16", ["sdpa", "blocked"], marks=pytest.mark.slow),  # a minute; float16 stays in the default run
    ("float16", ["sdpa"]),
])
def test_kit_passes_builtin_kernels_in_low_precision(dtype: str, kernels: list[str]) -> None:
    # a learned bias: its table's gradient sums many pairs (the relative gradient tolerance)
    report = check_attention("sliding_window", params={"window": 3, "position_bias": "learned"},
                             kernels=kernels, dtypes=(dtype,), isolate=False)
    report.raise_if_failed()
    for kernel in kernels:
        ran = {r.check for r in report.results if r.status == "pass" and r.kernel == kernel}
        assert ran >= {"shape_dtype_finite", "matches_reference", "gradients", "pattern"}


def test_kit_refuses_a_dtype_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="allowed values are .*bfloat16"):
        check_attention("full", dtypes=("int8",), isolate=False)


def test_cli_check_takes_dtype() -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["check", "causal", "--kernel", "sdpa", "--dtype", "bfloat16"])
    assert ok.exit_code == 0, ok.output
    assert "bfloat16" not in ok.output or "FAIL" not in ok.output
    bad = runner.invoke(app, ["check", "causal", "--dtype", "int8"])
    assert bad.exit_code == 2 and "--dtype" in bad.output and "bfloat16" in bad.output


def test_xformers_declares_its_float32_windows_unsupported_from_the_call() -> None:
    pattern = create_attention("sliding_window", window=4).pattern()
    kernel = get_kernel("xformers")

    def reasons(dtype: torch.dtype, causal: bool, grad: bool) -> str:
        call = AttentionCall(torch.device("cuda"), dtype, causal, grad)
        return " | ".join(kernel.not_supported_reasons(pattern, call))

    assert "cutlass" in reasons(torch.float32, causal=False, grad=False)  # no bidirectional local
    assert "cutlass" in reasons(torch.float32, causal=True, grad=True)  # no causal local backward
    assert "cutlass" not in reasons(torch.float32, causal=True, grad=False)
    for dtype in (torch.bfloat16, torch.float16):  # flash runs both windows
        assert "cutlass" not in reasons(dtype, causal=False, grad=True)
    full = create_attention("full").pattern()  # no band: no dtype-dependent refusal
    assert "cutlass" not in " ".join(kernel.not_supported_reasons(
        full, AttentionCall(torch.device("cuda"), torch.float32, False, True)))
