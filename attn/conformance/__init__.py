"""The conformance kit: one function proving that an attention keeps the contract.

    from attn.conformance import check_attention
    report = check_attention("sliding_window")          # or a factory / class
    report.raise_if_failed()                             # AssertionError listing failures

Checks, for every parameter set and every kernel the variant has (a kernel that
does not support a call is reported as skipped with its reason):

- ``band_matches_mask`` (once per parameter set, for a variant that declares a band): the
  band admits exactly the pairs the mask_mod admits (N = 24, every head), so the pattern the
  banded kernels run is the one the others run;
- ``grid_matches_mask`` (once per parameter set, for a variant that declares a token grid,
  :mod:`attn.grid`): the grid admits exactly the pairs the mask_mod admits (N = 23, a
  partial last frame, every head), so the pattern the ``factorised`` kernel runs is the one
  the others run;
- ``shape_dtype_finite``: output (B, H, Nq, Dv), input dtype, finite values;
- ``matches_reference``: exact variants equal the dense reference built from their own
  mask_mod / score_mod (fp64 atol 1e-10, fp32 1e-5) for odd lengths, B > 1, H = 4 (every
  module is built with ``num_heads=4``, divisible by per-head-group parameters),
  Nq != Nk, with and without ``key_mask`` and ``causal``, contiguous and head-split
  (non-contiguous) inputs; an approximation that gives ``reference_forward`` (its own
  definition computed directly) equals it on the same cases, with the tolerance scaled by
  the largest reference output;
- ``gradients``: finite, and for exact variants equal to the reference's (fp64) for
  q, k, v and the module's own parameters;
- ``pattern``: the keys that actually influence each query (probed by perturbing one
  value row at a time, N = 13; a kernel that compiles per shape at the kit's first shape,
  which its other checks compiled) are exactly those the mask_mod allows, so an off-by-one
  window is named by the (i, j) pairs where it differs;
- ``causal_no_leak``: perturbing keys/values after position t leaves rows <= t unchanged
  (the kit's first two shapes);
- ``key_mask``: perturbing padded keys changes nothing; an all-padding row gives zeros;
- ``batch_independence``: each batch element's output stays the same when every other
  element's inputs are replaced (the kit's first shape, with ``key_mask``);
- ``documents``: packed rows (``document_ids``: uneven documents, a one-token document, a
  row of one document) equal the dense reference of each document run alone, concatenated,
  outputs and gradients, with and without ``key_mask`` and ``causal``; a kernel that does not
  run packed calls is skipped with its reason (``refused: ...``);
- ``shape_sweep`` (kernels that compile per call shape): a fresh copy of the module runs many
  successive lengths (more than dynamo's recompile limit, including key lengths 8 past a
  multiple of 16, and one past ``flex``'s eager block-mask size) with q, k, v lying inside
  NaN-filled buffers, and each output must equal the dense
  reference, so a stale compiled entry or a kernel reading past its inputs is named by shape;
- ``grouped_query``: k, v with fewer heads than q (GQA with 2 of 4, MQA with 1, in turn over
  the cases) equal the reference with k, v repeated per group, output and gradients; an
  attention that does not declare ``supports_gqa`` is skipped as "GQA: not supported";
- ``converges`` (approximate variants with ``convergence_param``): error against full
  attention falls as the parameter grows (over ``convergence_values``) and is exact once it
  reaches N, or, for an approximation never exact (random features), within its stated
  ``convergence_bound`` at the last value.

The quick profile (``quick=True``, what ``attn-bench check`` runs unless ``--full``) runs
every check on every kernel with the first parameter set and the first two shapes
(:data:`QUICK_SHAPES`), each (causal, key_mask) combination on one of them. Every check of
one kernel runs on one copy of the module per dtype, so a kernel that compiles per module
compiles once per run (docs/contract.md, "What the kit costs").

Each check runs in a child process with a time limit (``timeout_s``, default
:data:`CHECK_TIMEOUT_S`): a variant that exits, crashes or hangs fails that check with the
cause, and the other checks still run (``isolate=False`` runs them in this process).
"""

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
