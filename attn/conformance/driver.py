"""The kit's driver: :func:`check_attention` builds the variant for each parameter set and
runs every check on every kernel it declares."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attn.base import Attention
from attn.conformance.checks import CHECKS, check_convergence
from attn.conformance.harness import HEADS, QUICK_SHAPES, SHAPES, active_shapes
from attn.conformance.report import CheckResult, ConformanceReport
from attn.registry import attention_info, build_attention, create_attention

Factory = Callable[..., Attention]


def check_attention(
    attention: str | Factory,
    *,
    params: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    kernels: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    quick: bool = False,
) -> ConformanceReport:
    """Run the conformance checks on a registered name or a factory/class.

    ``params``: one dict or several (default: the variant's ``example_params``).
    ``kernels``: which kernels to check (default: every kernel the variant declares).
    ``quick``: the first parameter set and two shapes only (for kernels that compile per
    shape, e.g. ``flex`` on CPU); every check still runs.
    """
    token = active_shapes.set(QUICK_SHAPES if quick else SHAPES)
    try:
        return _check_all(attention, params, kernels, torch.device(device), seed, quick)
    finally:
        active_shapes.reset(token)


def _check_all(attention, params, kernels, device: torch.device, seed: int, quick: bool) -> ConformanceReport:
    if isinstance(attention, str):
        name = attention
        param_sets = list(attention_info(name).example_params)

        def build(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
            return create_attention(name, num_heads=heads, head_dim=dim, kernel=kernel, **p)

    else:
        name = getattr(attention, "name", getattr(attention, "__name__", repr(attention)))
        param_sets = list(getattr(attention, "example_params", ({},)))

        def build(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
            return build_attention(attention, name=name, kernel=kernel, num_heads=heads,
                                   head_dim=dim, **p)

    if params is not None:
        param_sets = [params] if isinstance(params, dict) else list(params)
    if quick:
        param_sets = param_sets[:1]
    report = ConformanceReport(name)
    for p in param_sets:
        heads, dim = HEADS, SHAPES[0][4]  # H divisible by per-head-group parameters
        try:
            base = build("auto", heads, dim, p)
        except Exception as err:
            report.results.append(CheckResult("construct", "-", p, "fail", f"{type(err).__name__}: {err}"))
            continue
        _randomise_parameters(base, seed)
        for kernel in kernels if kernels is not None else base.kernels:
            module = copy.deepcopy(base).to(device)
            module.kernel = kernel
            for check in CHECKS:
                report.results.extend(check(module, kernel, p, device, seed))
        if not base.exact and base.convergence_param is not None:
            report.results.extend(check_convergence(build, base, p, device, seed))
    return report


def _randomise_parameters(module: Attention, seed: int) -> None:
    """Give learned parameters (e.g. a relative bias table) values large enough to matter."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)
