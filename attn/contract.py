"""The checks of q, k, v and key_mask (docs/contract.md); each error names the attention and the argument."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(name: str, q: Any, k: Any, v: Any, key_mask: Any = None) -> None:
    """Raise ``ValueError`` naming ``name`` and the argument when q/k/v/key_mask break the contract."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: argument '{arg}' must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name}: argument '{arg}' must be 4-D (B, H, N, D); got shape {tuple(t.shape)}"
            )
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{name}: argument '{arg}' has dtype {t.dtype}; allowed dtypes are "
                f"{', '.join(str(d) for d in FLOAT_DTYPES)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"{name}: arguments 'q', 'k', 'v' must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"{name}: arguments 'q', 'k', 'v' must be on one device; "
            f"got {q.device}, {k.device}, {v.device}"
        )
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"{name}: arguments 'k' and 'v' must share batch and key heads (B, H_kv); got "
            f"{tuple(k.shape[:2])} and {tuple(v.shape[:2])}"
        )
    check_kv_heads(name, q.shape[:2], k.shape[:2])
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{name}: arguments 'q' and 'k' must share head_dim D; got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(
            f"{name}: arguments 'k' and 'v' must share the key length Nk; got {k.shape[2]} and {v.shape[2]}"
        )
    if k.shape[2] == 0 or q.shape[2] == 0:
        raise ValueError(f"{name}: sequence lengths must be >= 1; got Nq={q.shape[2]}, Nk={k.shape[2]}")
    if key_mask is not None:
        check_key_mask(name, key_mask, batch=q.shape[0], keys=k.shape[2], device=q.device)


def check_kv_heads(name: str, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> None:
    """``ValueError`` unless k's ``(B, H_kv)`` fits q's ``(B, H)``: same batch and ``H % H_kv == 0``."""
    (batch, heads), (k_batch, kv_heads) = tuple(q_shape[:2]), tuple(k_shape[:2])
    if batch != k_batch or heads % kv_heads != 0:
        raise ValueError(
            f"{name}: arguments 'k', 'v' must have q's batch B and H_kv heads dividing q's H "
            f"(H % H_kv == 0); got q (B, H) = {(batch, heads)}, k/v (B, H_kv) = {(k_batch, kv_heads)}"
        )


def check_key_mask(name: str, key_mask: Any, *, batch: int, keys: int, device: torch.device) -> None:
    """Raise ``ValueError`` unless ``key_mask`` is a bool tensor of shape (batch, keys) on ``device``."""
    if not isinstance(key_mask, Tensor):
        raise ValueError(
            f"{name}: argument 'key_mask' must be a bool tensor (B, Nk) or None; "
            f"got {type(key_mask).__name__}"
        )
    if key_mask.dtype != torch.bool:
        raise ValueError(
            f"{name}: argument 'key_mask' must have dtype torch.bool (True = real token); "
            f"got {key_mask.dtype}"
        )
    if tuple(key_mask.shape) != (batch, keys):
        raise ValueError(
            f"{name}: argument 'key_mask' must have shape (B, Nk) = ({batch}, {keys}); "
            f"got {tuple(key_mask.shape)}"
        )
    if key_mask.device != device:
        raise ValueError(
            f"{name}: argument 'key_mask' is on {key_mask.device} but 'q' is on {device}; "
            "they must be on one device"
        )


def check_decoding_step(q_len: int, k_len: int) -> None:
    """A decoding state's ``step`` takes one query per new key (``Nq == Nk``)."""
    if q_len != k_len:
        raise ValueError(f"q: a decoding step takes one query per new key; got Nq={q_len}, Nk={k_len}")
