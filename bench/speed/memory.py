"""A memory model per kernel: the peak bytes a case needs, from N, B, H, D, dtype and pattern, before it runs.

With ``device_memory_gb`` the cases whose estimate does not fit are left out (docs/measurement.md).
Deliberately high (every transient of a pass alive at once): it decides what is tried, never what is
reported. Beyond its kernel's own, a case holds its inputs: 4 (B, H, N, D) tensors, 8 for a grad pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attn import create_attention
from attn.kernels.auto import auto_order
from attn.pattern import Pattern

GiB = 2**30
#: share of the device the estimate may use (the CUDA context, fragmentation and L2 flush take the rest)
USABLE = 0.9
#: the chunk of ``chunked`` (elements), its largest on any device
CHUNK_ELEMENTS = 4 * 2**20
#: flex's block size
FLEX_BLOCK = 128
GRAD_PASSES = ("bwd", "fwd_bwd", "train_step")

Shape = dict[str, int]
Model = Callable[[Pattern, Shape, int, bool, dict[str, Any]], float]


def _scores(shape: Shape) -> float:
    return shape["B"] * shape["H"] * shape["N"] ** 2


def _mask_heads(pattern: Pattern, shape: Shape) -> int:
    return shape["H"] if pattern.per_head else 1


def _grid(pattern: Pattern, shape: Shape) -> float:
    """The allowed-pairs grid: int64 and its bool (none without a mask or causality)."""
    if pattern.mask_mod is None and not shape["causal"]:
        return 0.0
    return 9.0 * _mask_heads(pattern, shape) * shape["N"] ** 2


def _reference(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """float32 scores, probabilities and a temporary (two more in a backward), the grid, a bias."""
    bias = 4.0 * shape["H"] * shape["N"] ** 2 if pattern.score_mod is not None else 0.0
    return 4.0 * _scores(shape) * (5 if grad else 3) + _grid(pattern, shape) + bias


def _sdpa(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """Nothing when fused; else the kept mask: grid, bool and the additive mask in the dtype."""
    if pattern.mask_mod is None and pattern.score_mod is None:
        return 0.0  # fused, is_causal
    heads = shape["H"] if (pattern.per_head or pattern.score_mod is not None) else 1
    bias = (4.0 + elem) * heads * shape["N"] ** 2 if pattern.score_mod is not None else 0.0
    return _grid(pattern, shape) + elem * heads * shape["N"] ** 2 + bias


def _blocked(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """One float32 band of scores (B, H, N, 2w + 1)."""
    window = int(params.get("window", 0)) * int(params.get("dilation", 1) or 1)
    band = 2 * window + 1 + int(params.get("num_global", 0))
    return 4.0 * shape["B"] * shape["H"] * shape["N"] * band * (2 if grad else 1)


def _chunked(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """A few (rows x N) chunks and a checkpointed output."""
    return 4.0 * CHUNK_ELEMENTS * 4 + 4.0 * shape["B"] * shape["H"] * shape["N"] * shape["D"]


def _flex(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """Four int32 (N/128)^2 block masks."""
    blocks = -(-shape["N"] // FLEX_BLOCK)
    return 4 * 4.0 * _mask_heads(pattern, shape) * blocks**2


def _xformers(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    return 4.0 * shape["B"] * shape["H"] * shape["N"]


def _native(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """Nystrom: six float32 (B, H, N, m) landmark kernels with their gradients (three forward)."""
    landmarks = int(params.get("num_landmarks", 64))
    kernels = 4.0 * shape["B"] * shape["H"] * shape["N"] * landmarks
    return kernels * (6 if grad else 3)


MODELS: dict[str, Model] = {"reference": _reference, "sdpa": _sdpa, "blocked": _blocked,
                            "chunked": _chunked, "flex": _flex, "xformers": _xformers,
                            "native": _native}


def pattern_of(variant: str, params: dict[str, Any], heads: int, head_dim: int) -> Pattern:
    """The pattern of a case's attention (built on the CPU, nothing large)."""
    return create_attention(variant, num_heads=heads, head_dim=head_dim, **params).pattern()


def estimate_bytes(pattern: Pattern, kernel: str, *, n: int, batch: int, heads: int,
                   head_dim: int, dtype: str, device: str, passes: tuple[str, ...],
                   params: dict[str, Any], causal: bool = False) -> float:
    """Estimated peak device bytes of the case's most demanding pass on ``kernel`` (``auto``: its first
    choice on ``device``; a kernel without a model: the reference's, the worst)."""
    if kernel == "auto":
        order = auto_order(pattern, torch.device(device), k_len=n)
        kernel = order[0] if order else "reference"
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    shape = {"B": batch, "H": heads, "N": n, "D": head_dim, "causal": int(causal)}
    grad = any(p in GRAD_PASSES for p in passes)
    tensor = float(batch * heads * n * head_dim * elem)
    inputs = tensor * (8 if grad else 4)
    return inputs + MODELS.get(kernel, _reference)(pattern, shape, elem, grad, params)


def fits(estimate: float, device_memory_gb: float) -> bool:
    """Whether ``estimate`` bytes fit in the usable share of a device of that many GiB."""
    return estimate <= USABLE * device_memory_gb * GiB
