"""The description of one attention call (what a kernel judges to say whether it can run it)
and of what ran for it (:class:`KernelPath`).

Kernels answer ``not_supported_reasons(pattern, call) -> list[str]`` (empty: supported), as
xformers' operators answer ``not_supported_reasons(inputs)``. A call built from tensors
(:meth:`AttentionCall.from_tensors`) knows its lengths and whether a ``key_mask`` is given;
one built without tensors (``attn-bench list``, a harness before it makes inputs) may leave
the lengths and head dim ``None``: "any", so checks that depend on them do not apply.
"""

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
        """The call ``attention(q, k, v, causal=causal, key_mask=key_mask)``.

        ``requires_grad`` defaults to whether autograd will record the call through q, k or v
        (a module with trainable parameters passes its own answer).
        """
        if requires_grad is None:
            requires_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return cls(q.device, q.dtype, bool(causal), bool(requires_grad), q.shape[2], k.shape[2],
                   q.shape[-1], key_mask is not None, document_ids is not None)

    @property
    def self_attention(self) -> bool | None:
        """True when Nq == Nk, False when they differ, None when either is unknown."""
        if self.q_len is None or self.k_len is None:
            return None
        return self.q_len == self.k_len

    def describe(self) -> str:
        """``device=cpu, dtype=torch.float32, causal=False, requires_grad=True`` and, when
        known, the lengths and the key mask: for error messages."""
        parts = [f"device={self.device}", f"dtype={self.dtype}", f"causal={self.causal}",
                 f"requires_grad={self.requires_grad}"]
        if self.q_len is not None:
            parts.append(f"Nq={self.q_len}")
        if self.k_len is not None:
            parts.append(f"Nk={self.k_len}")
        if self.has_key_mask:
            parts.append("key_mask given")
        if self.has_document_ids:
            parts.append("document_ids given")
        return ", ".join(parts)


@dataclass(frozen=True)
class KernelPath:
    """What actually ran for the last forward call: recorded on every benchmark row.

    ``mask_emulated`` is True when a sparse pattern was computed through a dense
    materialised mask (the cost of full attention); ``fallback`` names a known slow path;
    ``compile_s`` is the compilation time spent inside this call, if any; ``setup_s`` and
    ``setup_bytes`` are the time and bytes of cached structures this call built (a dense
    mask, a block mask), which later calls of the same shape reuse. ``backend`` names the
    backend a dispatching kernel ran (``sdpa``: ``flash``, ``flash-cpu``, ``memory-efficient``,
    ``cudnn``, ``math``), with what forced it where a mask did (``math (the mask rules out
    flash)``); None where the kernel has no backends to choose from.
    """

    kernel: str
    path: str
    mask_emulated: bool = False
    fallback: str | None = None
    compile_s: float | None = None  # time spent compiling in this call (first call of a shape)
    setup_s: float | None = None  # time building a cached mask in this call
    setup_bytes: int | None = None  # bytes of the cached mask built in this call
    backend: str | None = None  # the backend a dispatching kernel (sdpa) ran; None: no choice
