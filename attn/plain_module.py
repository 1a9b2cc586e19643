"""Plain plug-ins: a third-party ``nn.Module`` with the contract's forward, wrapped as :class:`PlainModuleAttention`
(docs/extending.md). Optional attributes: ``mask_mod()`` / ``score_mod()`` (the kit compares with their dense
reference), ``exact`` (default: True when it defines either mod), ``supports_causal`` (True), ``forces_causal``
(False), ``supports_gqa`` (False: a module written for equal heads would mis-broadcast ``H_kv < H``),
``example_params``."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor, nn

from attn.base import Attention, KernelPath
from attn.mods import MaskMod, ScoreMod
from attn.pattern import Pattern

#: the forward signature every plain module must accept
CONTRACT = "forward(q, k, v, *, causal=False, key_mask=None)"


@dataclass(frozen=True)
class PlainTraits:
    """What a plain module declares about itself (or the defaults)."""

    exact: bool
    supports_causal: bool
    forces_causal: bool
    supports_gqa: bool
    example_params: tuple[dict[str, Any], ...]


def plain_traits(module: nn.Module | type[nn.Module]) -> PlainTraits:
    """The optional attributes of a plain module (class or instance), with their defaults."""
    defines_mods = callable(getattr(module, "mask_mod", None)) or callable(getattr(module, "score_mod", None))
    return PlainTraits(
        exact=bool(getattr(module, "exact", defines_mods)),
        supports_causal=bool(getattr(module, "supports_causal", True)),
        forces_causal=bool(getattr(module, "forces_causal", False)),
        supports_gqa=bool(getattr(module, "supports_gqa", False)),
        example_params=tuple(getattr(module, "example_params", ({},))),
    )


def is_plain_module_class(obj: Any) -> bool:
    """True for an ``nn.Module`` subclass that is not an :class:`Attention`."""
    return inspect.isclass(obj) and issubclass(obj, nn.Module) and not issubclass(obj, Attention)


def contract_problem(module: nn.Module | type[nn.Module]) -> str | None:
    """Why ``module`` (class or instance) cannot be called as the contract's forward; None if it can."""
    cls = module if inspect.isclass(module) else type(module)
    if not issubclass(cls, nn.Module):
        return f"{cls.__qualname__} is not a torch.nn.Module"
    if cls.forward is nn.Module.forward:
        return f"{cls.__qualname__} defines no forward; it must define {CONTRACT}"
    try:
        signature = inspect.signature(cls.forward)
    except (TypeError, ValueError):  # not introspectable (e.g. a C extension): trust it
        return None
    try:
        signature.bind(None, "q", "k", "v", causal=False, key_mask=None)  # None stands for self
    except TypeError as err:
        return f"{cls.__qualname__}.forward{signature} does not accept (q, k, v, causal=..., key_mask=...): {err}"
    return None


def _qualified_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


class _StandIn(nn.Module):
    """The plain module of :meth:`PlainModuleAttention.default_pattern`."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                key_mask: Tensor | None = None) -> Tensor:
        return v  # (B, H, Nk, Dv): never run


class PlainModuleAttention(Attention):
    """An Attention around a plain ``nn.Module`` (held as ``inner``) that follows the tensor contract (kernel
    ``native``); ``name`` defaults to its class name, traits come from :func:`plain_traits`."""

    def __init__(
        self,
        module: nn.Module,
        *,
        name: str | None = None,
        kernel: str = "auto",
        num_heads: int | None = None,
        head_dim: int | None = None,
    ) -> None:
        problem = contract_problem(module)
        if problem is None and isinstance(module, Attention):
            problem = f"{type(module).__qualname__} is already an attn.Attention; use it directly"
        if problem is not None:
            raise ValueError(f"PlainModuleAttention: argument 'module' must follow {CONTRACT}; {problem}")
        self.name = name or type(module).__name__  # set first: Attention.__init__ names it in errors
        super().__init__(kernel=kernel, num_heads=num_heads, head_dim=head_dim)
        traits = plain_traits(module)
        for trait in fields(traits):  # exact, supports_causal, forces_causal, supports_gqa, example_params
            setattr(self, trait.name, getattr(traits, trait.name))
        self.inner = module

    @classmethod
    def default_pattern(cls) -> Pattern | None:
        """The pattern of a wrapper around a stand-in: every wrapper runs its module as itself."""
        return cls(_StandIn(), name="plain_module").pattern()

    def mask_mod(self) -> MaskMod | None:
        """The module's own ``mask_mod()``, or None (every key allowed) when it has none."""
        mod = getattr(self.inner, "mask_mod", None)
        return mod() if callable(mod) else None

    def score_mod(self) -> ScoreMod | None:
        """The module's own ``score_mod()``, or None when it has none."""
        mod = getattr(self.inner, "score_mod", None)
        return mod() if callable(mod) else None

    def native_forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None
    ) -> Tensor:
        """Call the plain module (inputs already checked by :meth:`Attention.forward`)."""
        try:
            out = self.inner(q, k, v, causal=causal, key_mask=key_mask)  # (B, H, Nq, Dv)
        except NotImplementedError as err:
            raise NotImplementedError(
                f"{self.name}: plain module {_qualified_name(self.inner)} refused this call: {err}"
            ) from err
        self._check_output(out, q, v)
        return out

    def _check_output(self, out: Any, q: Tensor, v: Tensor) -> None:
        expected = (*q.shape[:3], v.shape[-1])  # (B, H, Nq, Dv)
        if not isinstance(out, Tensor) or tuple(out.shape) != expected:
            got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"{self.name}: plain module {_qualified_name(self.inner)} returned {got}; the contract "
                f"requires a tensor of shape (B, H, Nq, Dv) = {expected}"
            )

    def native_path(self) -> KernelPath:
        """The path recorded in ``last_path``."""
        return KernelPath("native", f"plain module {_qualified_name(self.inner)}")

    def extra_repr(self) -> str:
        return f"name={self.name!r}, kernel={self.kernel!r}"
