"""One attention call as a kernel judges it (:class:`AttentionCall`), and what ran for it (:class:`KernelPath`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AttentionCall:
    """Device, dtype, causality, need for gradients, lengths and key padding of one call."""

    device: torch.device
    dtype: torch.dtype
    causal: bool = False
    requires_grad: bool = False
    q_len: int | None = None  # Nq; None: any
    k_len: int | None = None  # Nk; None: any
    head_dim: int | None = None  # D; None: any
    has_key_mask: bool = False
    has_document_ids: bool = False  # a packed call (docs/contract.md, "Packed sequences")
    kv_groups: int = 1  # query heads per key/value head, H / H_kv (1: multi-head)

    def __post_init__(self) -> None:
        if not isinstance(self.device, torch.device):  # "cpu", "cuda:0", ...
            object.__setattr__(self, "device", torch.device(self.device))

    @classmethod
    def from_tensors(
        cls,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool = False,
        key_mask: Tensor | None = None,
        requires_grad: bool | None = None,
        document_ids: Tensor | None = None,
    ) -> AttentionCall:
        """The call ``attention(q, k, v, causal=causal, key_mask=key_mask)``; ``requires_grad`` defaults to
        whether autograd records it through q, k or v."""
        if requires_grad is None:
            requires_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return cls(q.device, q.dtype, bool(causal), bool(requires_grad), q.shape[2], k.shape[2],
                   q.shape[-1], key_mask is not None, document_ids is not None,
                   kv_groups=max(q.shape[1] // max(k.shape[1], 1), 1))

    @property
    def self_attention(self) -> bool | None:
        """True when Nq == Nk, False when they differ, None when either is unknown."""
        return None if self.q_len is None or self.k_len is None else self.q_len == self.k_len

    def describe(self) -> str:
        """The call in words, for error messages."""
        parts = [f"device={self.device}", f"dtype={self.dtype}", f"causal={self.causal}",
                 f"requires_grad={self.requires_grad}"]
        optional = ((self.q_len is not None, f"Nq={self.q_len}"), (self.k_len is not None, f"Nk={self.k_len}"),
                    (self.has_key_mask, "key_mask given"), (self.has_document_ids, "document_ids given"),
                    (self.kv_groups > 1, f"{self.kv_groups} query heads per key head (GQA)"))
        return ", ".join([*parts, *(text for given, text in optional if given)])


@dataclass(frozen=True)
class KernelPath:
    """What actually ran for the last forward call (docs/contract.md), recorded on every benchmark row."""

    kernel: str
    path: str
    mask_emulated: bool = False  # a sparse pattern computed through a dense mask
    fallback: str | None = None  # a known slow path taken
    compile_s: float | None = None  # time spent compiling in this call (first call of a shape)
    setup_s: float | None = None  # time building a cached mask in this call
    setup_bytes: int | None = None  # bytes of the cached mask built in this call
    backend: str | None = None  # what a dispatching kernel (sdpa) ran, e.g. "math (the mask rules out flash)"
