"""The kit's ``band_matches_mask`` check: a declared band admits exactly the pairs the mask_mod admits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attn.base import Attention
from attn.conformance.harness import HEADS
from attn.conformance.report import CheckResult
from attn.mods import dense_allowed
from attn.pattern import Band

CHECK = "band_matches_mask"
#: the length of the square call the band and the mask_mod are compared on
BAND_LEN = 24


def band_allows(band: Band, heads: int, n: int) -> Tensor:
    """``(H, N, N)`` bool: the pairs ``band`` admits, from :class:`~attn.pattern.Band`'s rule, not a mask_mod."""
    allowed = torch.zeros(heads, n, n, dtype=torch.bool)
    for h, rate in enumerate(band.head_dilations(heads)):
        for i in range(n):
            for j in range(n):
                in_band = (i - j) % rate == 0 and abs(i - j) <= rate * band.window
                allowed[h, i, j] = i < band.num_global or j < band.num_global or in_band
    return allowed


def check_band(module: Attention, params: dict[str, Any]) -> list[CheckResult]:
    """Compare ``module.band()`` with ``module.mask_mod()`` at ``N = BAND_LEN``, every head."""
    return check_declared(module, params, check=CHECK, what="band", declared=module.band(),
                          allows=band_allows, n=BAND_LEN)


def check_declared(module: Attention, params: dict[str, Any], *, check: str, what: str, declared: Any,
                   allows: Callable[[Any, int, int], Tensor], n: int) -> list[CheckResult]:
    """Compare a second definition ``declared`` (band or grid), whose pairs ``allows`` gives, with the
    mask_mod at ``N = n``: pass, skip (nothing declared) or fail naming the differing pairs."""
    heads = module.num_heads or HEADS
    if declared is None:
        return [CheckResult(check, "-", params, "skip", f"no {what} declared")]
    try:
        admitted = allows(declared, heads, n)  # (H, N, N)
        mask = dense_allowed(module.mask_mod(), batch=1, heads=heads, q_len=n, k_len=n, causal=False,
                             key_mask=None, device=torch.device("cpu"))  # (1, H|1, N, N) | None
    except Exception as err:
        return [CheckResult(check, "-", params, "fail", f"raised {type(err).__name__}: {err}")]
    expected = torch.ones(heads, n, n, dtype=torch.bool) if mask is None else mask.expand(1, heads, n, n)[0]
    wrong = (admitted != expected).nonzero().tolist()
    if not wrong:
        return [CheckResult(check, "-", params, "pass")]
    pairs = ", ".join(
        f"(i={i}, j={j}, head {h}: mask_mod {'allows' if expected[h, i, j] else 'forbids'}, "
        f"{what} {'admits' if admitted[h, i, j] else 'excludes'} it)"
        for h, i, j in wrong[:5]
    )
    message = (f"the declared {what} {declared} and the mask_mod differ at {len(wrong)} (head, i, j) "
               f"pairs, e.g. {pairs} [N={n}, causal=False]")
    return [CheckResult(check, "-", params, "fail", message)]
