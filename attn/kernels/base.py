"""The kernel interface: :class:`Kernel`, the :class:`KernelPath` each run reports, and the
:class:`Band` structure a banded variant declares for kernels that compute only the band."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import Tensor

if TYPE_CHECKING:
    from attn.base import Attention
    from attn.call import AttentionCall


@dataclass(frozen=True)
class KernelPath:
    """What actually ran for the last forward call: recorded on every benchmark row.

    ``mask_emulated`` is True when a sparse pattern was computed through a dense
    materialised mask (the cost of full attention); ``fallback`` names a known slow path;
    ``compile_s`` is the compilation time spent inside this call, if any; ``setup_s`` and
    ``setup_bytes`` are the time and bytes of cached structures this call built (a dense
    mask, a block mask), which later calls of the same shape reuse.
    """

    kernel: str
    path: str
    mask_emulated: bool = False
    fallback: str | None = None
    compile_s: float | None = None  # time spent compiling in this call (first call of a shape)
    setup_s: float | None = None  # time building a cached mask in this call
    setup_bytes: int | None = None  # bytes of the cached mask built in this call


@dataclass(frozen=True)
class Band:
    """Banded structure of a pattern, for kernels that compute only the band (O(N*w)).

    Allowed (non-causal): ``(i - j) % dilation == 0 and |i - j| <= dilation * window``,
    or ``i < num_global`` or ``j < num_global``.
    """

    window: int
    dilation: int = 1
    num_global: int = 0


class Kernel:
    """An implementation of attention semantics. Stateless apart from caches."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when every new call shape costs a compilation (tests use the kit's quick profile)
    compiles_per_shape: ClassVar[bool] = False

    def not_supported_reasons(self, attention: Attention, call: AttentionCall) -> list[str]:
        """Reasons this kernel cannot run ``attention`` for ``call``; [] = supported.

        Every refusal that depends on the call (device, dtype, causal, gradients, lengths,
        a ``key_mask``) belongs here, not in :meth:`run`: dispatch, ``auto``, the conformance
        kit and the benchmark read it before running. A length the call leaves ``None``
        means "any length": checks of that length do not apply.
        """
        return []

    def exactness_reasons(self, attention: Attention) -> list[str]:
        """[] for an exact variant; else the reason this (exact-attention) kernel cannot run it."""
        if attention.exact:
            return []
        return [f"{attention.name} is approximate; {self.name} computes exact attention only"]

    def run(
        self,
        attention: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, KernelPath]:
        """Compute the attention output ``(B, H, Nq, Dv)`` and describe the path taken."""
        raise NotImplementedError
