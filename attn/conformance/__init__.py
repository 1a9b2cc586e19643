"""The conformance kit (docs/contract.md): ``check_attention("sliding_window").raise_if_failed()`` (a name, factory
or class). Each check runs in a child process under ``timeout_s`` (default :data:`CHECK_TIMEOUT_S`), so a variant
that crashes or hangs fails that check only (``isolate=False``: in this process)."""

from attn.conformance.driver import CHECK_TIMEOUT_S, Factory, check_attention
from attn.conformance.harness import (
    ATOL,
    CHECK_DTYPES,
    EXACT_DTYPES,
    GRAD_ATOL,
    GRAD_RTOL,
    GUARD_ROWS,
    HEADS,
    LOW_PRECISION_DTYPES,
    NONE_RAN,
    PROBE_EPS,
    PROBE_LEN,
    PROBE_STEP,
    QUICK_SHAPES,
    SHAPES,
    SWEEP_BATCH,
    SWEEP_DIM,
    SWEEP_LENGTHS,
)
from attn.conformance.report import CheckResult, ConformanceReport

__all__ = [
    "ATOL",
    "CHECK_DTYPES",
    "CHECK_TIMEOUT_S",
    "EXACT_DTYPES",
    "GRAD_ATOL",
    "GRAD_RTOL",
    "GUARD_ROWS",
    "HEADS",
    "LOW_PRECISION_DTYPES",
    "NONE_RAN",
    "PROBE_EPS",
    "PROBE_LEN",
    "PROBE_STEP",
    "QUICK_SHAPES",
    "SHAPES",
    "SWEEP_BATCH",
    "SWEEP_DIM",
    "SWEEP_LENGTHS",
    "CheckResult",
    "ConformanceReport",
    "Factory",
    "check_attention",
]
