"""The kernel interface: :class:`Kernel`, which runs a :class:`~attn.pattern.Pattern` and reports
the :class:`~attn.call.KernelPath` it took (``Band`` and ``KernelPath`` are re-exported here)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from attn.call import AttentionCall, KernelPath
from attn.pattern import Band, Pattern

#: device types as the reasons spell them
_DEVICE_NAMES = {"cuda": "CUDA", "cpu": "CPU"}


def host_reads_are_free(device: torch.device) -> bool:
    """True where reading a tensor's value on the host (``int(t)``, ``bool(t.any())``,
    ``.cpu()``) costs no device synchronisation: the CPU. On an accelerator a kernel's hot path
    must not read values on the host (each read waits for every queued kernel), so it takes
    the branch-free path instead (e.g. applies a mask it cannot cheaply prove empty)."""
    return torch.device(device).type == "cpu"


class Kernel:
    """An implementation of attention semantics. Stateless apart from caches.

    A kernel states what it supports in one place, :meth:`not_supported_reasons`: the devices
    and dtypes it runs (:attr:`SUPPORTED_DEVICES`, :attr:`SUPPORTED_DTYPES`, checked here for
    every kernel), whether it runs the variants' definitions (:attr:`runs_definitions`), and
    what an override adds for patterns and calls. Which kernels a variant can use is derived
    from these answers (:func:`attn.kernels.kernels_for`); no variant lists them.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when every new call shape costs a compilation (tests use the kit's quick profile)
    compiles_per_shape: ClassVar[bool] = False
    #: device types the kernel runs on (``"cpu"``, ``"cuda"``); None: any
    SUPPORTED_DEVICES: ClassVar[tuple[str, ...] | None] = None
    #: dtypes the kernel computes in; None: any
    SUPPORTED_DTYPES: ClassVar[tuple[torch.dtype, ...] | None] = None
    #: True for kernels that compute float16 / bfloat16 inputs in float32 (their matmuls run at
    #: the float32 peak: a benchmark's peak fraction divides by that one, :func:`compute_dtype`)
    computes_half_in_float32: ClassVar[bool] = False
    #: True for kernels that compute exact attention from a pattern's mask_mod / score_mod /
    #: band: they refuse approximations and variants that bring their own implementation
    runs_definitions: ClassVar[bool] = True
    #: True for kernels that run packed calls (``document_ids``) exactly; the others refuse
    #: them (:meth:`not_supported_reasons`), so a packed call is never silently unpacked
    supports_document_ids: ClassVar[bool] = False
    #: True for kernels that evaluate a score_mod once, on zero scores, and add it as a bias:
    #: they refuse a score term that changes with the score (:attr:`Pattern.score_is_bias`)
    adds_score_as_bias: ClassVar[bool] = False

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        """Reasons this kernel cannot run ``pattern`` for ``call``; [] = supported.

        ``call=None`` asks about the pattern alone (any device, dtype and lengths): the
        answer that decides which kernels a variant has. Every refusal that depends on the
        call (device, dtype, causal, gradients, lengths, a ``key_mask``) belongs here, not in
        :meth:`run`: dispatch, ``auto``, the conformance kit and the benchmark read it before
        running. A length the call leaves ``None`` means "any length": checks of that length
        do not apply. Overrides extend the base's reasons (``super().not_supported_reasons``).
        """
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
        """Compute the attention output ``(B, H, Nq, Dv)`` of ``pattern`` and describe the path
        taken. ``causal`` already includes the pattern's ``always_causal``."""
        raise NotImplementedError


#: the dtypes :attr:`Kernel.computes_half_in_float32` kernels upcast
HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(kernel: Kernel, dtype: torch.dtype, native_in_float32: bool = False) -> torch.dtype:
    """The dtype ``kernel``'s matmuls run in for inputs of ``dtype``: float32 for half inputs
    to a kernel that upcasts them (``native``: when the variant says its own implementation
    does, ``native_in_float32``), else ``dtype``."""
    upcasts = kernel.computes_half_in_float32 or (kernel.name == "native" and native_in_float32)
    return torch.float32 if upcasts and dtype in HALF_DTYPES else dtype


__all__ = ["HALF_DTYPES", "Band", "Kernel", "KernelPath", "compute_dtype", "host_reads_are_free"]
