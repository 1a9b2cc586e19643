"""What one attention call computes, as a value: the :class:`Pattern` a kernel reads, and the :class:`Band` of a
banded pattern (docs/contract.md, "What a kernel is given")."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attn.call import AttentionCall, KernelPath
from attn.documents import Documents, packed_mods
from attn.grid import Grid, head_runs
from attn.mods import MaskMod, ScoreMod, index_grids


@dataclass(frozen=True)
class Band:
    """Banded structure for O(N*w) kernels: ``(i - j) % dilation == 0 and |i - j| <= dilation * window``, or
    ``i < num_global`` or ``j < num_global``; ``group_dilations``: one rate per contiguous head group,
    ``dilation`` their max (the band's reach in every head)."""

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
        """``(h0, h1, band)``: contiguous head ranges with one uniform band each (:func:`attn.grid.head_runs`)."""
        if not self.per_head:
            return [(0, heads, self)]
        runs = head_runs(self.group_dilations, heads, "Band", "group_dilations")
        return [(h0, h1, Band(self.window, rate, self.num_global)) for h0, h1, rate in runs]

    def head_dilations(self, heads: int) -> tuple[int, ...]:
        """The dilation of each of ``heads`` heads."""
        return tuple(band.dilation for h0, h1, band in self.head_groups(heads) for _ in range(h0, h1))


@dataclass(frozen=True, eq=False)
class RelativeBias:
    """A declarative relative position score term ``b_h(j - i)``, read by kernels instead of the score_mod:
    ``learned``: ``values`` the table ``(H, 2M+1)``, ``b_h(d) = table[h, clamp(d, -M, M) + M]``; ``alibi``:
    ``values`` the slopes ``(H,)``, ``b_h(d) = -slope_h * |d|`` (no gradient)."""

    kind: str
    values: Tensor
    max_distance: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("learned", "alibi"):
            raise ValueError(f"RelativeBias: kind must be 'learned' or 'alibi'; got {self.kind!r}")

    @property
    def heads(self) -> int:
        """The number of heads the bias has values for."""
        return self.values.shape[0]

    @property
    def trainable(self) -> bool:
        """True for a learned table that requires grad."""
        return self.kind == "learned" and self.values.requires_grad

    def offsets(self, lo: int, hi: int, dtype: torch.dtype | None = None) -> Tensor:
        """The bias at offsets ``d = j - i`` in ``[lo, hi]``: ``(H, hi - lo + 1)``."""
        d = torch.arange(lo, hi + 1, device=self.values.device)  # (L,)
        if self.kind == "learned":
            m = self.max_distance
            out = self.values[:, d.clamp(-m, m) + m]  # (H, L)
        else:
            out = -self.values[:, None] * d.abs()  # (H, L)
        return out if dtype is None else out.to(dtype)


@dataclass(frozen=True)
class Native:
    """A variant's own implementation (kernel ``native``): ``forward(q, k, v, causal, key_mask)``,
    optional ``not_supported_reasons(call)`` and ``path()``."""

    forward: Callable[[Tensor, Tensor, Tensor, bool, Tensor | None], Tensor]
    not_supported_reasons: Callable[[AttentionCall], list[str]] | None = None
    path: Callable[[], KernelPath] | None = None


class PatternOwner:
    """The identity of the module that builds a pattern, weakly referenced by caches that must die with it;
    ``score_terms`` caches :attr:`Pattern.score_is_bias` by key, so an undeclared score term is tried once."""

    __slots__ = ("__weakref__", "score_terms")

    def __init__(self) -> None:
        self.score_terms: dict[Hashable, bool] = {}


@dataclass(frozen=True, eq=False)
class Pattern:
    """What one call computes, built once per call and read by its kernel (fields: docs/contract.md). ``key`` and
    ``shared`` are computed only when a kernel asks: walking the mods' closures costs 20-40 us per call."""

    name: str
    exact: bool = True
    mask_mod: MaskMod | None = None
    score_mod: ScoreMod | None = None
    band: Band | None = None
    grid: Grid | None = None
    per_head: bool = False
    heads: int | None = None
    always_causal: bool = False
    score_params: tuple[Tensor, ...] = ()
    native: Native | None = None
    relative_bias: RelativeBias | None = None
    owner: PatternOwner = field(default_factory=PatternOwner)
    #: a packed call's documents (:mod:`attn.documents`), or None; then ``mask_mod`` /
    #: ``score_mod`` are the packed forms and ``within`` is the pattern each document runs alone
    documents: Documents | None = None
    within: Pattern | None = None

    def packed(self, documents: Documents) -> Pattern:
        """This pattern on a packed call (:func:`attn.documents.packed_mods`); ``within`` keeps it whole."""
        mask_mod, score_mod = packed_mods(documents, self.mask_mod, self.score_mod)
        return dataclasses.replace(self, mask_mod=mask_mod, score_mod=score_mod,
                                   relative_bias=None, documents=documents, within=self)

    @functools.cached_property
    def score_is_bias(self) -> bool:
        """Whether the score term is an additive bias independent of the score (declared, or proven
        once per owner and key; soft-capping is not)."""
        if self.score_mod is None or self.relative_bias is not None:
            return True
        if self.within is not None:
            return self.within.score_is_bias
        known = self.owner.score_terms
        if self.key not in known:
            known[self.key] = _score_is_bias(self.score_mod,
                                             self.score_params[0].device if self.score_params else None)
        return known[self.key]

    @functools.cached_property
    def _key_and_shared(self) -> tuple[Hashable, bool]:
        identities: list[Any] = []
        key = ("pattern", _fingerprint(self.mask_mod, identities, set()),
               _fingerprint(self.score_mod, identities, set()), self.per_head)
        return key, not identities

    @property
    def key(self) -> Hashable:
        """The mods' fingerprint: equal keys compute the same attention."""
        return self._key_and_shared[0]

    @property
    def shared(self) -> bool:
        """Whether :attr:`key` holds plain values only (no tensor or object identities)."""
        return self._key_and_shared[1]


def _score_is_bias(score_mod: ScoreMod, device: torch.device | None, size: int = 8) -> bool:
    """``score_mod(s) - s`` equal for zero scores and for scores in [-50, 50]; a failing mod is unproven."""
    b, h, i, j = index_grids(1, 1, size, size, device or torch.device("cpu"))
    zeros = torch.zeros(1, 1, size, size, device=b.device)
    spread = torch.linspace(-50.0, 50.0, size * size, device=b.device).view(1, 1, size, size)
    try:
        with torch.no_grad():
            terms = [(score_mod(s, b, h, i, j) - s).expand(1, 1, size, size) for s in (zeros, spread)]
    except Exception:  # any failure leaves the term unproven
        return False
    return bool(torch.allclose(terms[0].float(), terms[1].float(), rtol=1e-5, atol=1e-4))


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
#: attributes that say how a module runs, not what it computes
_RUN_ATTRIBUTES = frozenset({"kernel", "training", "last_path"})


def _fingerprint(value: Any, identities: list[Any], seen: set[int]) -> Hashable:
    """``value`` hashable: plain data by value, functions by code and closure, the rest by identity."""
    if isinstance(value, _PLAIN):
        return (type(value).__qualname__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__qualname__, tuple(_fingerprint(x, identities, seen) for x in value))
    if isinstance(value, (set, frozenset)):
        parts = sorted((_fingerprint(x, identities, seen) for x in value), key=repr)
        return (type(value).__qualname__, tuple(parts))
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: repr(item[0]))
        return ("dict", tuple((_fingerprint(k, identities, seen), _fingerprint(v, identities, seen))
                              for k, v in items))
    if id(value) in seen:  # a function or object that contains itself
        return ("cycle", type(value).__qualname__)
    seen.add(id(value))
    try:
        return _composite(value, identities, seen)
    finally:
        seen.discard(id(value))


def _composite(value: Any, identities: list[Any], seen: set[int]) -> Hashable:
    """The fingerprint of a function, method, partial, frozen dataclass or other object."""
    if isinstance(value, types.FunctionType):
        cells = tuple(_cell(c, identities, seen) for c in value.__closure__ or ())
        return ("function", value.__module__, value.__qualname__, value.__code__, id(value.__globals__),
                _fingerprint(value.__defaults__, identities, seen),
                _fingerprint(value.__kwdefaults__, identities, seen), cells)
    if isinstance(value, types.MethodType):
        return ("method", _fingerprint(value.__func__, identities, seen),
                _fingerprint(value.__self__, identities, seen))
    if isinstance(value, functools.partial):
        return ("partial", *(_fingerprint(x, identities, seen) for x in (value.func, value.args, value.keywords)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:
        return ("dataclass", type(value).__qualname__,
                tuple(_fingerprint(getattr(value, f.name), identities, seen) for f in dataclasses.fields(value)))
    identities.append(value)
    if isinstance(value, Tensor):
        return ("tensor", id(value))
    return ("object", id(value), _attributes(value))


def _cell(cell: Any, identities: list[Any], seen: set[int]) -> Hashable:
    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell
        return ("empty",)
    return _fingerprint(contents, identities, seen)


def _attributes(obj: Any) -> tuple:
    """Plain public attributes of ``obj`` and its submodules, so a changed hyper-parameter changes the key."""
    owners = list(obj.named_modules()) if callable(getattr(obj, "named_modules", None)) else [("", obj)]
    items = []
    for path, owner in owners:
        for name, value in getattr(owner, "__dict__", {}).items():
            if name[0] == "_" or name in _RUN_ATTRIBUTES:
                continue
            plain: list[Any] = []
            part = _fingerprint(value, plain, set()) if isinstance(value, (*_PLAIN, tuple, list, dict)) else None
            if part is not None and not plain:
                items.append((path, name, part))
    return tuple(items)
