"""The kit's driver: :func:`check_attention`."""

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
    """Run the conformance checks (docs/contract.md) on a registered name or a factory/class.

    ``params``: one dict or several (default: ``example_params``); ``kernels``: default every kernel the variant
    has; ``quick``: the first parameter set and two shapes; ``dtypes``: names or ``torch.dtype`` (default float64
    and float32). ``isolate``: each check in a child process under ``timeout_s`` (None: no limit); a variant that
    cannot be sent to a child is checked here. ``on_result`` gets each result, ``on_start`` each step started."""
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
