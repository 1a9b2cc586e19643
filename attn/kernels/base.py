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

    Per-head form: ``group_dilations = (r_0, ..., r_{k-1})`` splits the H heads into ``k``
    contiguous groups of ``H // k`` heads, and head ``h`` uses ``r_{h // (H // k)}`` in place
    of ``dilation``; ``dilation`` is then ``max(group_dilations)``, the band's reach
    (``|i - j| <= dilation * window`` holds in every head, so a reader that only needs a
    bound, such as a KV cache's kept keys, may use it). A kernel runs the per-head form
    through :meth:`head_groups` (one uniform band per run of heads); build it with
    :meth:`per_head_groups`, which returns the uniform form when every group is equal.
    """

    window: int
    dilation: int = 1
    num_global: int = 0
    group_dilations: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.group_dilations and self.dilation != max(self.group_dilations):
            raise ValueError(
                f"Band: 'dilation' must be max(group_dilations) = {max(self.group_dilations)} "
                f"(the band's reach); got {self.dilation}"
            )

    @classmethod
    def per_head_groups(cls, window: int, dilations: tuple[int, ...], num_global: int = 0) -> Band:
        """The band of per-head-group ``dilations`` (uniform when they are all equal)."""
        dilations = tuple(int(r) for r in dilations)
        if len(set(dilations)) == 1:
            return cls(window, dilations[0], num_global)
        return cls(window, max(dilations), num_global, dilations)

    @property
    def per_head(self) -> bool:
        """True when the heads do not all share one dilation."""
        return bool(self.group_dilations)

    def head_groups(self, heads: int) -> list[tuple[int, int, Band]]:
        """``(h0, h1, band)``: contiguous head ranges ``[h0, h1)`` with one uniform band each
        (adjacent groups of equal dilation merged); ``[(0, heads, self)]`` for a uniform band.
        ``ValueError`` when ``heads`` is not divisible by the number of groups."""
        if not self.per_head:
            return [(0, heads, self)]
        groups = len(self.group_dilations)
        if heads % groups:
            raise ValueError(
                f"Band: {heads} heads are not divisible into the {groups} head groups of "
                f"group_dilations={self.group_dilations}"
            )
        size = heads // groups
        runs: list[list[int]] = []  # [h0, h1, dilation]
        for g, rate in enumerate(self.group_dilations):
            if runs and runs[-1][2] == rate:
                runs[-1][1] = (g + 1) * size
            else:
                runs.append([g * size, (g + 1) * size, rate])
        return [(h0, h1, Band(self.window, rate, self.num_global)) for h0, h1, rate in runs]

    def head_dilations(self, heads: int) -> tuple[int, ...]:
        """The dilation of each of ``heads`` heads."""
        return tuple(band.dilation for h0, h1, band in self.head_groups(heads) for _ in range(h0, h1))


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
