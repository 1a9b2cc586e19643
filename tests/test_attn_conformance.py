"""Every registered variant, on every kernel it declares, passes the conformance kit.

Parametrised over the registry: a newly registered variant is tested with no new test code.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from attn import ExactAttention, attention_info, get_kernel, list_attention
from attn.conformance import ATOL, GRAD_ATOL, LOW_PRECISION_DTYPES, check_attention
from attn.kernels.reference import dense_attention
from attn.variants.sliding_window import sliding_window_mod
from bench.cli.app import app

#: kernels that compile per call shape (flex on CPU: ~10 s a shape, ~1 min a variant even in
#: the quick profile) are checked on one mask_mod variant and one score_mod variant here;
#: ``attn-bench check NAME --kernel flex`` runs the kit on any other.
COMPILED_KERNEL_VARIANTS = ("sliding_window", "relative")


def _in_suite(name: str, kernel: str) -> bool:
    return not get_kernel(kernel).compiles_per_shape or name in COMPILED_KERNEL_VARIANTS


def _cases() -> list:
    """``(name, kernel, quick)``: every kernel of every variant in the quick profile (the first
    example parameter set) in the default run, and in the full kit (every set, every shape;
    ``slow``, 2-3x as long) in the full run. Kernels that compile per shape (flex on CPU: ~10 s
    each) run the quick profile only, which still sweeps 12 lengths on one module (check
    shape_sweep), and are marked ``compile``."""
    cases = []
    for name in list_attention():
        for kernel in attention_info(name).kernels:
            if not _in_suite(name, kernel):
                continue
            if get_kernel(kernel).compiles_per_shape:
                cases.append(pytest.param(name, kernel, True, id=f"{name}-{kernel}", marks=pytest.mark.compile))
                continue
            cases.append(pytest.param(name, kernel, True, id=f"{name}-{kernel}-quick"))
            cases.append(pytest.param(name, kernel, False, id=f"{name}-{kernel}", marks=pytest.mark.slow))
    return cases


@pytest.mark.parametrize(("name", "kernel", "quick"), _cases())
def test_variant_kernel_conforms(name: str, kernel: str, quick: bool) -> None:
    report = check_attention(name, kernels=[kernel], quick=quick)
    report.raise_if_failed()
    if not any(r.status == "pass" for r in report.results):
        pytest.skip(f"{kernel} runs none of the checks here: {report.results[0].message}")


def test_every_builtin_variant_is_registered() -> None:
    expected = {"full", "causal", "sliding_window", "dilated", "global_tokens", "nystrom", "relative"}
    assert expected <= set(list_attention())


def test_exact_kernels_are_compared_with_reference() -> None:
    report = check_attention("sliding_window", params={"window": 3}, kernels=["sdpa"])
    checks = {r.check: r.status for r in report.results}
    assert checks["matches_reference"] == "pass"
    assert checks["pattern"] == "pass"
    assert checks["causal_no_leak"] == "pass"
    # sdpa compiles nothing per call shape: the shape sweep is skipped, saying why
    (sweep,) = [r for r in report.results if r.check == "shape_sweep"]
    assert sweep.status == "skip" and "compiles_per_shape is False" in sweep.message


# The kit checks bfloat16 and float16 (the dtypes a GPU sweep times) against the float64
# reference with per-dtype tolerances.
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
