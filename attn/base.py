"""Base classes for attention modules: the contract, kernel dispatch and the exact-variant core."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attn.call import AttentionCall, KernelPath
from attn.contract import check_qkv
from attn.cost import Cost, CostQuery, exact_cost, pairs_cost
from attn.devices import module_device
from attn.documents import Documents, check_document_ids
from attn.grid import Grid
from attn.kernels import auto, get_kernel, kernel_names, kernels_for
from attn.mods import MaskMod, ScoreMod
from attn.pattern import Band, Native, Pattern, PatternOwner, RelativeBias
from attn.position_bias import POSITION_BIASES, RelativePositionBias
from attn.validation import Param, require_choice

#: the head count and head dim of the probe that finds a class's kernels (:meth:`Attention.class_kernels`)
PROBE_HEADS, PROBE_DIM = 8, 64


class Attention(nn.Module):
    """Base of every registered attention (docs/contract.md).

    A subclass declares mods (:class:`ExactAttention`) or a ``native_forward``; its kernels are derived."""

    name: ClassVar[str] = "attention"
    #: kernels ``auto`` tries first (a preference, not a statement of support)
    preferred_kernels: ClassVar[tuple[str, ...]] = ()
    exact: ClassVar[bool] = True
    #: True when the variant's own implementation (kernel ``native``) computes float16 /
    #: bfloat16 inputs in float32 (:func:`attn.kernels.base.compute_dtype`)
    native_computes_half_in_float32: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    #: k, v may have fewer heads than q; False by default for a variant that overrides ``native_forward``
    supports_gqa: ClassVar[bool] = True
    forces_causal: ClassVar[bool] = False
    #: small parameter sets that make the conformance kit meaningful at short lengths
    example_params: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    #: for approximate variants: the parameter whose growth must converge to full attention
    convergence_param: ClassVar[str | None] = None
    #: the values the kit's ``converges`` check tries on 45 tokens (None: 2, 4, 8, 16, 32, 45)
    convergence_values: ClassVar[tuple[int, ...] | None] = None
    #: the largest error against full attention at the last value; None: exact there (<= 1e-8)
    convergence_bound: ClassVar[float | None] = None
    #: this class's constructor parameter rules (merged along the MRO by :meth:`check_params`)
    param_rules: ClassVar[dict[str, Param]] = {
        "num_heads": Param(minimum=1, optional=True),
        "head_dim": Param(minimum=1, optional=True),
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kernels" in vars(cls):
            raise TypeError(
                f"{cls.__qualname__}: an attention does not list its kernels; they are derived from "
                "what each kernel supports (attn.kernels.kernels_for). Name the kernels 'auto' "
                "should try first in 'preferred_kernels'"
            )
        own_code = cls.native_forward is not Attention.native_forward
        declared = any("supports_gqa" in vars(klass) for klass in cls.__mro__ if klass is not Attention)
        if own_code and not declared:  # its own code was not said to take H_kv < H
            cls.supports_gqa = False

    def __init__(
        self, *, kernel: str = "auto", num_heads: int | None = None, head_dim: int | None = None
    ) -> None:
        super().__init__()
        self.check_params(kernel=kernel, num_heads=num_heads, head_dim=head_dim)
        self.kernel = kernel
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.last_path: KernelPath | None = None

    # parameters: checked from the class, without building a module
    @classmethod
    def check_params(cls, **params: Any) -> None:
        """``ValueError`` naming the parameter for any value the constructor refuses, without building a module:
        each ``param_rules`` rule (``kernel`` against :meth:`class_kernels`), then :meth:`check_together`."""
        rules: dict[str, Param] = {}
        for klass in reversed(cls.__mro__):
            rules.update(vars(klass).get("param_rules", {}))
        for key, value in params.items():
            subject = f"{cls.name}: parameter '{key}'"
            if key == "kernel":
                if value != "auto":
                    require_choice(subject, value, ("auto", *cls.class_kernels()))
            elif key in rules:
                rules[key].check(subject, value)
        cls.check_together(params)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        """Rules that join several parameters; each applies only when ``params`` holds what it joins."""

    # kernels: derived from what each kernel supports
    @classmethod
    def default_pattern(cls) -> Pattern | None:
        """The pattern built with default parameters on the meta device (random state kept), or None."""
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                return cls(num_heads=PROBE_HEADS, head_dim=PROBE_DIM).pattern()
        except Exception:  # e.g. a constructor argument without a default
            return None

    @classmethod
    def class_kernels(cls) -> tuple[str, ...]:
        """The kernels that support :meth:`default_pattern` (every kernel when it has none)."""
        pattern = cls.default_pattern()
        return kernel_names() if pattern is None else kernels_for(pattern)

    def supported_kernels(self) -> tuple[str, ...]:
        """The kernels that can run this module's pattern (on some call)."""
        return kernels_for(self.pattern())

    # semantics (exact variants override)
    def mask_mod(self) -> MaskMod | None:
        """The allowed(b, h, i, j) predicate, or None when every key is allowed."""
        return None

    def score_mod(self) -> ScoreMod | None:
        """The additive score term score_mod(score, b, h, i, j), or None."""
        return None

    def score_params(self) -> tuple[Tensor, ...]:
        """The tensors ``score_mod`` reads, which autograd must see (default: every parameter)."""
        return tuple(self.parameters())

    def relative_bias(self) -> RelativeBias | None:
        """``score_mod``'s :class:`attn.pattern.RelativeBias` form when it is exactly one, else None."""
        return None

    def mask_depends_on_head(self) -> bool:
        """True when ``mask_mod`` reads ``h``; kernels then build one mask per head instead of sharing one."""
        return False

    def band(self) -> Band | None:
        """Banded structure for O(N*w) kernels, or None; the conformance kit checks it against ``mask_mod``."""
        return None

    def grid(self) -> Grid | None:
        """The token grid of a factorised pattern (:mod:`attn.grid`), or None; checked against ``mask_mod``."""
        return None

    def native_forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None
    ) -> Tensor:
        """The variant's own implementation (kernel ``native``); overriding it makes the variant run as itself."""
        raise NotImplementedError(
            f"{self.name}: no native implementation; use kernels {list(self.supported_kernels())}"
        )

    def reference_forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None
    ) -> Tensor | None:
        """An approximation's definition computed directly (O(Nq * Nk)) for the kit's ``matches_reference``, or None."""
        return None

    def new_decoding_state(self) -> Any | None:
        """A causal decoding state replacing the KV cache (``step``, ``reorder``, ``length``:
        :class:`attn.kernelized.KernelizedState`), or None."""
        return None

    def pattern(self) -> Pattern:
        """What this module computes, as the value its kernel reads."""
        return Pattern(
            name=self.name, exact=self.exact, mask_mod=self.mask_mod(), score_mod=self.score_mod(),
            band=self.band(), grid=self.grid(), per_head=self.mask_depends_on_head(), heads=self.num_heads,
            always_causal=self.forces_causal, score_params=self.score_params(),
            native=self._native(), relative_bias=self.relative_bias(),
            owner=self.__dict__.setdefault("_pattern_owner", PatternOwner()),
        )

    def _native(self) -> Native | None:
        if type(self).native_forward is Attention.native_forward:
            return None
        return Native(self.native_forward, getattr(self, "native_not_supported_reasons", None),
                      getattr(self, "native_path", None))

    def cost(self, query: CostQuery) -> Cost:
        """FLOPs of a call of this shape (:mod:`attn.cost`); an approximation not overriding it counts as full."""
        if self.exact:
            return exact_cost(self.pattern(), query, module_device(self))  # where its mods' tensors are
        return pairs_cost(query.q_len * query.k_len, query, kind="full_equivalent")

    # dispatch
    def not_supported_reasons(self, call: AttentionCall, kernel: str | None = None) -> list[str]:
        """Reasons why ``kernel`` (default: this module's) cannot run ``call``; [] = supported."""
        kernel = kernel or self.kernel
        if self.forces_causal and not call.causal:
            call = replace(call, causal=True)
        if call.causal and not self.supports_causal:
            return [f"{self.name} does not support causal=True"]
        if call.kv_groups > 1 and not self.supports_gqa:
            return [gqa_refusal(self.name)]
        pattern = self.pattern()
        if kernel == "auto":
            try:
                self._auto_kernel(pattern, call)
            except NotImplementedError as err:
                return [str(err)]
            return []
        if kernel not in kernel_names():
            return [f"{self.name} has no kernel {kernel!r}; its kernels are {list(kernels_for(pattern))}"]
        return get_kernel(kernel).not_supported_reasons(pattern, call)

    def resolve_kernel(self, call: AttentionCall) -> str:
        """The kernel that runs ``call``; ``NotImplementedError`` when ``auto`` finds none."""
        return self._auto_kernel(self.pattern(), call) if self.kernel == "auto" else self.kernel

    def _auto_kernel(self, pattern: Pattern, call: AttentionCall) -> str:
        """``auto``'s kernel for ``call``, asking each kernel's reasons at most once."""
        device_type = call.device.type
        # the short-call limit follows the variant's kind: as fixed as the choices themselves
        limits = self.__dict__.setdefault("_auto_short_keys", {})
        where = (device_type, call.dtype, call.requires_grad)  # a tuning file's limit is per dtype and pass
        if where not in limits:
            limits[where] = auto.short_keys(pattern, call.device, call.dtype, call.requires_grad)
        limit = limits[where]
        short = limit is not None and call.k_len is not None and call.k_len < limit
        key = (call.device, call.dtype, call.causal, call.requires_grad, call.has_key_mask, short,
               call.has_document_ids)
        cache = self.__dict__.setdefault("_auto_choices", {})
        name = cache.get(key)
        known = {} if name is None else {name: get_kernel(name).not_supported_reasons(pattern, call)}
        if name is None or known[name]:
            chosen = auto.choose_kernel(pattern, call, self.preferred_kernels, known)
            if name is None:  # a kernel the remembered one refuses (for its lengths) is not remembered
                cache[key] = chosen
            name = chosen
        return name

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Attention of ``q (B, H, Nq, D)`` over ``k (B, H_kv, Nk, D)``, ``v (B, H_kv, Nk, Dv)``
        (``H % H_kv == 0``: query head h reads key head ``h // (H / H_kv)``); ``document_ids
        (B, N)``: a packed call (docs/contract.md, "Packed sequences")."""
        check_qkv(self.name, q, k, v, key_mask)
        if document_ids is not None:
            check_document_ids(self.name, document_ids, batch=q.shape[0], q_len=q.shape[2],
                               k_len=k.shape[2], device=q.device)
        if self.num_heads is not None and q.shape[1] != self.num_heads:
            raise ValueError(
                f"{self.name}: argument 'q' has {q.shape[1]} heads but the module was built with "
                f"num_heads={self.num_heads}"
            )
        causal = bool(causal) or self.forces_causal
        if causal and not self.supports_causal:
            raise NotImplementedError(
                f"{self.name}: argument 'causal' must be False; {self.name} has no causal form"
            )
        if k.shape[1] != q.shape[1] and not self.supports_gqa:
            raise NotImplementedError(f"{self.name}: arguments 'k', 'v' must have q's {q.shape[1]} heads; "
                                      f"got {k.shape[1]}: {gqa_refusal(self.name)}")
        requires_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad
            or any(p.requires_grad for p in self.parameters())
        )
        call = AttentionCall.from_tensors(q, k, v, causal, key_mask, requires_grad, document_ids)
        pattern = self.pattern()
        if self.kernel == "auto":  # auto chose a kernel that supports the call
            name = self._auto_kernel(pattern, call)
        else:
            name = self.kernel
            reasons = get_kernel(name).not_supported_reasons(pattern, call)
            if reasons:
                raise NotImplementedError(
                    f"{self.name}: kernel {name!r} cannot run this call: {'; '.join(reasons)}"
                )
        if document_ids is not None:  # the kernel chosen above runs packed calls
            pattern = pattern.packed(Documents.from_ids(document_ids))
        out, path = get_kernel(name).run(pattern, q, k, v, causal, key_mask)  # (B, H, Nq, Dv)
        self.last_path = path
        return out

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"


def gqa_refusal(name: str) -> str:
    """The reason an attention without grouped-query support gives for a call with ``H_kv < H``."""
    return f"{name} does not support grouped-query attention (k, v with fewer heads than q)"


def require_num_heads(name: str, params: dict[str, Any], setting: str, why: str) -> None:
    """``ValueError`` when ``params`` gives ``num_heads=None`` though ``setting`` needs it (``why``)."""
    if "num_heads" in params and params["num_heads"] is None:
        raise ValueError(f"{name}: parameter 'num_heads' is required with {setting} ({why})")


class ExactAttention(Attention):
    """An exact variant, defined by ``mask_mod`` plus an optional ``position_bias``
    (``None``, ``"learned"`` or ``"alibi"``)."""

    param_rules: ClassVar[dict[str, Param]] = {
        "position_bias": Param(choices=(None, *POSITION_BIASES)),
        "max_distance": Param(minimum=0),
    }

    def __init__(
        self,
        *,
        position_bias: str | None = None,
        max_distance: int = 128,
        kernel: str = "auto",
        num_heads: int | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__(kernel=kernel, num_heads=num_heads, head_dim=head_dim)
        self.check_params(position_bias=position_bias, max_distance=max_distance, num_heads=num_heads)
        self.max_distance = max_distance
        self.position_bias: RelativePositionBias | None = None
        if position_bias is not None:
            self.position_bias = RelativePositionBias(position_bias, num_heads, max_distance)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        super().check_together(params)
        bias = params.get("position_bias")
        if bias is not None:
            require_num_heads(cls.name, params, f"position_bias={bias!r}", "the bias has one set of values per head")

    def score_mod(self) -> ScoreMod | None:
        return None if self.position_bias is None else self.position_bias.score_mod()

    def relative_bias(self) -> RelativeBias | None:
        return None if self.position_bias is None else self.position_bias.describe()

    def extra_repr(self) -> str:
        bias = "" if self.position_bias is None else f", position_bias={self.position_bias.kind!r}"
        return f"kernel={self.kernel!r}{bias}"
