"""A memory model per kernel, deliberately high: a case's peak bytes before it runs, for ``device_memory_gb``."""

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


#: side of the smaller of the two grids on which a mask's build is measured
PROFILE_SIDE = 256
#: at most this many head planes of a per-head mask are built to count them
PROFILE_HEADS = 4


class _LiveBytes(TorchDispatchMode):
    """The peak bytes of the storages of the tensors made inside it, each until its last tensor is gone."""

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
    """Peak bytes while ``pattern``'s grid of ``n`` x ``n`` allowed pairs is built, as ``a n^2 + b n``."""
    square, linear = _build_terms(pattern, heads, causal)
    return square * n**2 + linear * n


@functools.lru_cache(maxsize=256)  # a sweep asks once per kernel and length of one pattern
def _build_terms(pattern: Pattern, heads: int, causal: bool) -> tuple[float, float]:
    """``(a, b)`` of :func:`build_bytes`; a per-head mask past :data:`PROFILE_HEADS`: a shared part and one per head."""
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
    return 4.0 * shape["B"] * shape["H"] * shape["N"] ** 2 * (5 if grad else 3) + _grid(pattern, shape) + bias


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
    return 4 * 4.0 * (shape["H"] if pattern.per_head else 1) * blocks**2


def _xformers(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    return 4.0 * shape["B"] * shape["H"] * shape["N"]


def _native(pattern: Pattern, shape: Shape, elem: int, grad: bool, params: dict) -> float:
    """Nystrom: six float32 (B, H, N, m) landmark kernels with their gradients (three forward)."""
    return 4.0 * shape["B"] * shape["H"] * shape["N"] * int(params.get("num_landmarks", 64)) * (6 if grad else 3)


MODELS: dict[str, Model] = {"reference": _reference, "sdpa": _sdpa, "blocked": _blocked,
                            "chunked": _chunked, "flex": _flex, "xformers": _xformers,
                            "native": _native}


def pattern_of(variant: str, params: dict[str, Any], heads: int, head_dim: int) -> Pattern:
    """The pattern of a case's attention (built on the CPU, nothing large)."""
    return create_attention(variant, num_heads=heads, head_dim=head_dim, **params).pattern()


def estimate_bytes(pattern: Pattern, kernel: str, *, n: int, batch: int, heads: int,
                   head_dim: int, dtype: str, device: str, passes: tuple[str, ...],
                   params: dict[str, Any], causal: bool = False) -> float:
    """Peak device bytes of a case's worst pass on ``kernel`` (``auto``: its first choice; else as the reference)."""
    grad = any(p in GRAD_PASSES for p in passes)
    if kernel == "auto":
        order = auto_order(pattern, torch.device(device), k_len=n, dtype=getattr(torch, dtype), grad=grad)
        kernel = order[0] if order else "reference"
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    shape = {"B": batch, "H": heads, "N": n, "D": head_dim, "causal": int(causal)}
    inputs = float(batch * heads * n * head_dim * elem) * (8 if grad else 4)  # 4 (B, H, N, D) tensors, 8 in a grad pass
    return inputs + MODELS.get(kernel, _reference)(pattern, shape, elem, grad, params)


def fits(estimate: float, device_memory_gb: float) -> bool:
    """Whether ``estimate`` bytes fit in the usable share of a device of that many GiB."""
    return estimate <= USABLE * device_memory_gb * GiB
