"""``kernel="auto"``: the fastest supported kernel for the call, by a fixed documented rule.

Rule: take the first kernel, in the order below, that the variant has and that supports
the call (device, dtype, causal, grad). The order puts O(N) / O(N*w) implementations
before dense ones; ``reference`` is last because it is the O(N^2) ground truth.
"""

from __future__ import annotations

import torch

from attn.base import Attention

#: preference order per device type; kernels a variant lacks are skipped
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "cpu": ("native", "sdpa", "reference"),
    "cuda": ("native", "sdpa", "reference"),
}


def choose_kernel(
    attention: Attention, device: torch.device, dtype: torch.dtype, causal: bool, requires_grad: bool
) -> str:
    """Name of the kernel ``kernel="auto"`` runs for such a call; NotImplementedError if none."""
    from attn.kernels import get_kernel, list_kernels

    order = AUTO_ORDER.get(torch.device(device).type, AUTO_ORDER["cpu"])
    known = set(list_kernels())
    candidates = [k for k in order if k in attention.kernels] + [
        k for k in attention.kernels if k not in order
    ]
    reasons: list[str] = []
    for name in candidates:
        if name not in known:
            continue
        why = get_kernel(name).supports(attention, torch.device(device), dtype, causal, requires_grad)
        if not why:
            return name
        reasons.append(f"{name}: {'; '.join(why)}")
    raise NotImplementedError(
        f"{attention.name}: no kernel supports this call (device={device}, dtype={dtype}, "
        f"causal={causal}, requires_grad={requires_grad}): {' | '.join(reasons) or 'none declared'}"
    )
