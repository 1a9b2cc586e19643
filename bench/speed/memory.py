"""A memory model per kernel: the peak bytes a case needs, from N, B, H, D, dtype and pattern, before it runs.

With ``device_memory_gb`` the cases whose estimate does not fit are left out (docs/measurement.md).
Deliberately high (every transient of a pass alive at once): it decides what is tried, never what is
reported. Beyond its kernel's own, a case holds its inputs: 4 (B, H, N, D) tensors, 8 for a grad pass.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from attn import create_attention
from attn.kernels.auto import auto_order
from attn.mods import dense_allowed
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


#: side of the smaller of the two grids on which a mask's build is measured
PROFILE_SIDE = 256
#: at most this many head planes of a per-head mask are built to count them
PROFILE_HEADS = 4


class _LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by tensors made inside it: a storage counts from the first
    tensor on it until the last one made here is gone (views share their base's storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.holders: dict[int, int] = {}  # storage address -> tensors on it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._hold(tensor)
        return out

    def _hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if not self.holders.get(address):
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.holders[address] = self.holders.get(address, 0) + 1
        weakref.finalize(tensor, self._drop, address, nbytes)

    def _drop(self, address: int, nbytes: int) -> None:
        self.holders[address] -= 1
        if not self.holders[address]:
            self.live -= nbytes


def _peak_of_build(pattern: Pattern, heads: int, causal: bool, side: int) -> int:
    with _LiveBytes() as counter:
        allowed = dense_allowed(pattern.mask_mod, batch=1, heads=heads, q_len=side, k_len=side,
                                causal=causal, key_mask=None, device=torch.device("cpu"))
    del allowed
    return counter.peak


def build_bytes(pattern: Pattern, heads: int, causal: bool, n: int) -> float:
    """Peak bytes while the allowed-pairs grid of ``pattern`` for ``n`` queries and keys is built,
    the grid included: the index arithmetic of its ``mask_mod`` (``i - j``, ``abs``, ``%``, a head
    plane per rate...) makes int64 temporaries. Counted on builds of :data:`PROFILE_SIDE` and twice
    that on the CPU, as ``a n^2 + b n`` (the index vectors are the ``n`` term); a per-head mask on
    more than :data:`PROFILE_HEADS` heads as a shared part and a part per head."""
    square, linear = _build_terms(pattern, heads, causal)
    return square * n**2 + linear * n


@functools.lru_cache(maxsize=256)  # a sweep asks once per kernel and length of one pattern
def _build_terms(pattern: Pattern, heads: int, causal: bool) -> tuple[float, float]:
    """``(a, b)`` of :func:`build_bytes`."""
    def at(planes: int) -> tuple[float, float]:  # from two sides, with ``planes`` heads
        side = PROFILE_SIDE
        small, large = (_peak_of_build(pattern, planes, causal, s) for s in (side, 2 * side))
        square = (large - 2 * small) / (2 * side**2)
        return square, max((small - square * side**2) / side, 0.0)

    if not pattern.per_head or heads <= PROFILE_HEADS:
        return at(heads if pattern.per_head else 1)
    few, more = at(PROFILE_HEADS // 2), at(PROFILE_HEADS)  # a shared part and one plane per head
    per_head = (heads - PROFILE_HEADS) / (PROFILE_HEADS - PROFILE_HEADS // 2)
    return tuple(m + (m - f) * per_head for m, f in zip(more, few))  # type: ignore[return-value]


def _grid(pattern: Pattern, shape: Shape) -> float:
    """The allowed-pairs grid as its build peaks: temporaries and the bool (none without a mask or causality)."""
    if pattern.mask_mod is None and not shape["causal"]:
        return 0.0
    return build_bytes(pattern, shape["H"], bool(shape["causal"]), shape["N"])


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
