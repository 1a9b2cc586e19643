"""The kit's driver: :func:`check_attention` builds the variant for each parameter set and
runs every check on every kernel it has, each check in a child process under a time
limit (:mod:`attn.conformance.isolation`), or here when asked (``isolate=False``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attn.conformance.checklist import Factory, builder, steps
from attn.conformance.harness import (
    active_dtypes,
    dtypes_from,
    enter_profile,
    leave_profile,
    typed_copies,
)
from attn.conformance.isolation import CHECK_TIMEOUT_S, Job, run_isolated, sendable
from attn.conformance.report import CheckResult, ConformanceReport

__all__ = ["CHECK_TIMEOUT_S", "Factory", "check_attention"]


def check_attention(
    attention: str | Factory,
    *,
    params: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    kernels: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    quick: bool = False,
    dtypes: Sequence[str | torch.dtype] | None = None,
    timeout_s: float | None = CHECK_TIMEOUT_S,
    isolate: bool = True,
    on_result: Callable[[CheckResult], None] | None = None,
    on_start: Callable[[str, str, dict[str, Any]], None] | None = None,
) -> ConformanceReport:
    """Run the conformance checks on a registered name or a factory/class.

    ``params``: one dict or several (default: the variant's ``example_params``).
    ``kernels``: which kernels to check (default: every kernel that supports the variant's
    pattern, :meth:`~attn.base.Attention.supported_kernels`).
    ``quick``: the first parameter set and two shapes only (for kernels that compile per
    shape, e.g. ``flex`` on CPU); every check still runs.
    ``dtypes``: the dtypes the checks run in (names or ``torch.dtype``; default float64 and
    float32, each where the kernel supports it). ``("bfloat16",)`` or ``("float16",)`` prove
    the low-precision calls a GPU sweep times: every check in that dtype, each output and
    gradient against the float64 reference of the same rounded inputs, with that dtype's
    tolerances (:data:`~attn.conformance.ATOL`, :data:`~attn.conformance.GRAD_ATOL`).
    ``isolate`` (default): every check runs in a child process and gets at most
    ``timeout_s`` seconds (None: no limit); a variant that exits, crashes or hangs gives a
    FAIL result naming the check and the cause, and the checks after it still run. A
    variant that cannot be sent to a child process (a class defined inside a function) is
    checked here, without a time limit, and the report says so. ``isolate=False`` checks
    here (what this process changed, e.g. a patched kernel table, is then seen).
    ``on_result`` is called with each result as it arrives (a line per check as it goes),
    ``on_start`` with ``(check, kernel, params)`` as each check starts (a check compiling a
    kernel may run for many seconds before its result).
    """
    device = torch.device(device)
    name = builder(attention)[0]  # an unknown name raises here, as the registry says
    checked = dtypes_from(dtypes)  # a dtype the kit cannot check raises here
    note = None
    if isolate:
        target, why = sendable(attention)
        if why is None:
            job = Job(attention, target if isinstance(attention, str) else None, params,
                      None if kernels is None else tuple(kernels), str(device), seed, quick,
                      tuple(str(d).removeprefix("torch.") for d in checked))
            return run_isolated(job, name, timeout_s, on_result, on_start)
        note = (f"checked in this process with no time limit: {name} cannot be sent to a child "
                f"process ({why}); define it at the top level of an importable module")
    profile = enter_profile(quick)
    dtype_token = active_dtypes.set(checked)
    copies_token = typed_copies.set(weakref.WeakKeyDictionary())
    try:
        report = ConformanceReport(name, on_result=on_result)
        for step in steps(attention, params, kernels, device, seed, quick):
            if on_start is not None:
                on_start(step.check, step.kernel, step.params)
            report.add(step.run())
    finally:
        leave_profile(profile)
        active_dtypes.reset(dtype_token)
        typed_copies.reset(copies_token)
    if note is not None:
        report.notes.append(note)
    return report
