"""The kit's checklist: every check of a :func:`~attn.conformance.check_attention` call as a numbered step in a
fixed order (per parameter set: ``construct``, the declared structure's check, :data:`~attn.conformance.checks.CHECKS`
on every kernel, ``converges``), so a run can be cut at any step and resumed after it."""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attn.base import Attention
from attn.conformance.band import CHECK as BAND_CHECK
from attn.conformance.band import check_band
from attn.conformance.checks import CHECKS, check_convergence
from attn.conformance.grid import CHECK as GRID_CHECK
from attn.conformance.grid import check_grid
from attn.conformance.harness import HEADS, SHAPES
from attn.conformance.report import CheckResult
from attn.registry import attention_info, build_attention, create_attention

Factory = Callable[..., Attention]
Builder = Callable[[str, int, int, dict[str, Any]], Attention]


@dataclass(frozen=True)
class Step:
    """One check of the checklist: its number, what it checks, and how to run it."""

    index: int
    check: str
    kernel: str
    params: dict[str, Any]
    run: Callable[[], list[CheckResult]]


def builder(attention: str | Factory) -> tuple[str, list[dict[str, Any]], Builder]:
    """The name, example parameter sets and builder of a registered name or a factory/class."""
    if isinstance(attention, str):
        name = attention

        def build(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
            return create_attention(name, num_heads=heads, head_dim=dim, kernel=kernel, **p)

        return name, list(attention_info(name).example_params), build
    name = getattr(attention, "name", getattr(attention, "__name__", repr(attention)))

    def build_factory(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
        return build_attention(attention, name=name, kernel=kernel, num_heads=heads,
                               head_dim=dim, **p)

    return name, list(getattr(attention, "example_params", ({},))), build_factory


def steps(attention: str | Factory, params: dict[str, Any] | Sequence[dict[str, Any]] | None,
          kernels: Sequence[str] | None, device: torch.device, seed: int,
          quick: bool) -> Iterator[Step]:
    """The checklist step by step; a ``construct`` step must run before the later steps are made."""
    _, param_sets, build = builder(attention)
    if params is not None:
        param_sets = [params] if isinstance(params, dict) else list(params)
    if quick:
        param_sets = param_sets[:1]
    counter = itertools.count()
    for p in param_sets:
        built: dict[str, Attention] = {}
        yield Step(next(counter), "construct", "-", p, functools.partial(_construct, build, p, seed, built))
        base = built.get("base")
        if base is None:
            continue
        if base.band() is not None:
            yield Step(next(counter), BAND_CHECK, "-", p, functools.partial(check_band, base, p))
        if base.grid() is not None:
            yield Step(next(counter), GRID_CHECK, "-", p, functools.partial(check_grid, base, p))
        for kernel in kernels if kernels is not None else base.supported_kernels():
            module = copy.deepcopy(base).to(device)
            module.kernel = kernel
            for check in CHECKS:
                yield Step(next(counter), check.__name__, kernel, p,
                           functools.partial(check, module, kernel, p, device, seed))
        if not base.exact and base.convergence_param is not None:
            yield Step(next(counter), "converges", base.kernel, p,
                       functools.partial(check_convergence, build, base, p, device, seed))


def _construct(build: Builder, p: dict[str, Any], seed: int,
               built: dict[str, Attention]) -> list[CheckResult]:
    heads, dim = HEADS, SHAPES[0][4]  # H divisible by per-head-group parameters
    try:
        base = build("auto", heads, dim, p)
    except Exception as err:
        return [CheckResult("construct", "-", p, "fail", f"{type(err).__name__}: {err}")]
    randomise_parameters(base, seed)
    built["base"] = base
    return []


def randomise_parameters(module: Attention, seed: int) -> None:
    """Give learned parameters (e.g. a relative bias table) values large enough to matter."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)
