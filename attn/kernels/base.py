"""The kernel interface: :class:`Kernel`, which runs a :class:`~attn.pattern.Pattern` and reports
the :class:`~attn.call.KernelPath` it took (``Band`` and ``KernelPath`` are re-exported here)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from attn.call import AttentionCall, KernelPath
from attn.pattern import Band, Pattern
from attn.precision import HALF_DTYPES, upcast

#: torch's CPU flash kernel and its backward (None where this torch lacks them)
CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
CPU_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
#: device types as the reasons spell them
_DEVICE_NAMES = {"cuda": "CUDA", "cpu": "CPU"}


def host_reads_are_free(device: torch.device) -> bool:
    """True on the CPU: elsewhere reading a value on the host syncs the device, so hot paths branch-free."""
    return torch.device(device).type == "cpu"


class Kernel:
    """An implementation of attention semantics, stateless apart from caches; what it supports is stated in
    :meth:`not_supported_reasons` alone (docs/kernels.md)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when every new call shape costs a compilation (tests use the kit's quick profile)
    compiles_per_shape: ClassVar[bool] = False
    #: device types the kernel runs on (``"cpu"``, ``"cuda"``); None: any
    SUPPORTED_DEVICES: ClassVar[tuple[str, ...] | None] = None
    #: dtypes the kernel computes in; None: any
    SUPPORTED_DTYPES: ClassVar[tuple[torch.dtype, ...] | None] = None
    #: True for kernels that compute float16 / bfloat16 inputs in float32 (:func:`compute_dtype`)
    computes_half_in_float32: ClassVar[bool] = False
    #: True for kernels that compute exact attention from a pattern's definition (refuse approximations)
    runs_definitions: ClassVar[bool] = True
    #: True for kernels that run packed calls (``document_ids``); the others refuse them, never unpack
    supports_document_ids: ClassVar[bool] = False
    #: True for kernels that add a score_mod evaluated on zero scores (:attr:`Pattern.score_is_bias`)
    adds_score_as_bias: ClassVar[bool] = False
    #: a kernel tuned for the CPU's caches runs on CUDA up to this many keys, where it is still a fair
    #: row beside the GPU's own kernels (docs/kernels.md, "On CUDA"); None: no cap
    CUDA_MAX_KEYS: ClassVar[int | None] = None

    def past_cuda_cap(self, device_type: str, k_len: int | None) -> bool:
        """Whether ``k_len`` keys on ``device_type`` exceed :attr:`CUDA_MAX_KEYS`."""
        cap = self.CUDA_MAX_KEYS
        return cap is not None and device_type == "cuda" and (k_len or 0) > cap

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        """Reasons this kernel cannot run ``pattern`` for ``call`` (None: the pattern alone); [] = supported.
        Every refusal that depends on the call belongs here, never in :meth:`run`; overrides extend this one."""
        reasons = []
        if call is not None:
            if self.SUPPORTED_DEVICES is not None and call.device.type not in self.SUPPORTED_DEVICES:
                where = "/".join(_DEVICE_NAMES.get(d, d) for d in self.SUPPORTED_DEVICES)
                reasons.append(f"{self.name} runs on {where} only; device is {call.device.type}")
            if self.SUPPORTED_DTYPES is not None and call.dtype not in self.SUPPORTED_DTYPES:
                names = "/".join(str(d).removeprefix("torch.") for d in self.SUPPORTED_DTYPES)
                reasons.append(f"{self.name} supports {names}, not {call.dtype}")
            if call.has_document_ids and not self.supports_document_ids:
                reasons.append(f"{self.name} does not run packed sequences (document_ids)")
            if self.past_cuda_cap(call.device.type, call.k_len):
                reasons.append(f"{self.name} is tuned for the CPU; on CUDA it runs up to {self.CUDA_MAX_KEYS:,} "
                               f"keys (this call has {call.k_len:,}), beyond which flex, SDPA or xformers do its work")
        if self.runs_definitions:
            if not pattern.exact:
                reasons.append(f"{pattern.name} is approximate; {self.name} computes exact attention only")
            elif pattern.native is not None:
                reasons.append(f"{pattern.name} brings its own implementation (native_forward), "
                               "which runs as kernel 'native'")
        if self.adds_score_as_bias and pattern.score_mod is not None and not pattern.score_is_bias:
            reasons.append(f"{pattern.name}: its score_mod is not an additive bias (it changes with the "
                           f"score, as soft-capping does); {self.name} adds a bias evaluated on zero scores")
        return reasons

    def run(
        self,
        pattern: Pattern,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, KernelPath]:
        """The output ``(B, H, Nq, Dv)`` of ``pattern`` and the path taken; ``causal`` includes ``always_causal``."""
        raise NotImplementedError


def compute_dtype(kernel: Kernel, dtype: torch.dtype, native_in_float32: bool = False) -> torch.dtype:
    """The dtype ``kernel``'s matmuls run in for ``dtype`` inputs (``native``: float32 for half inputs when
    ``native_in_float32``)."""
    upcasts = kernel.computes_half_in_float32 or (kernel.name == "native" and native_in_float32)
    return upcast(dtype) if upcasts else dtype


__all__ = ["HALF_DTYPES", "Band", "Kernel", "KernelPath", "compute_dtype", "host_reads_are_free"]
