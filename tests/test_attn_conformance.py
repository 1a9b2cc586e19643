"""Every registered variant, on every kernel it declares, passes the conformance kit.

Parametrised over the registry: a newly registered variant is tested with no new test code.
"""

from __future__ import annotations

import pytest

from attn import attention_info, get_kernel, list_attention
from attn.conformance import check_attention

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
