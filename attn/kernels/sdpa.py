"""The ``sdpa`` kernel: ``scaled_dot_product_attention``, fused for full and causal (Nq == Nk), else through a
mask cached per module and shape and flagged ``mask_emulated`` (SDPA's ``is_causal`` is top-left aligned, the
contract bottom-right). The mask is additive float in the input dtype, the form SDPA converts a bool mask to on
every call (docs/kernels.md); a constant bias (ALiBi) is folded in, a learned one added per call."""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend

from attn.gqa import gqa_note
from attn.kernels.base import Kernel, KernelPath, host_reads_are_free
from attn.mods import dense_allowed, index_grids
from attn.pattern import Pattern, PatternOwner

#: cached masks kept per module (most recently used shapes)
MAX_CACHED_SHAPES = 4
#: the names rows give torch's SDPBackend values (``flash`` on CPU is torch's C++ flash kernel)
_BACKEND_NAMES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "memory-efficient",
                  "CUDNN_ATTENTION": "cudnn", "MATH": "math", "OVERRIDEABLE": "overrideable"}
#: at most this many call signatures keep their backend answer (a sweep has a few per case)
MAX_CACHED_BACKENDS = 256
_backend_cache: OrderedDict[tuple, str] = OrderedDict()


def _enabled_backends() -> tuple[bool, ...]:
    """Which SDPA backends are enabled now (``sdpa_kernel`` sets the same flags on any device)."""
    cuda = torch.backends.cuda
    return (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
            cuda.cudnn_sdp_enabled())


def _gqa(q: Tensor, k: Tensor) -> dict[str, bool]:
    """SDPA's keyword for a grouped-query call (k, v with fewer heads than q); {} otherwise."""
    return {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}


def _sdpa(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention``, with ``enable_gqa`` when k, v have fewer heads."""
    return F.scaled_dot_product_attention(q, k, v, **kwargs, **_gqa(q, k))


def _choice(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> str:
    """The backend SDPA's dispatcher picks (``"none"``: no enabled one can; ``"unknown"``: torch can't say)."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:  # pragma: no cover - every torch >= 2.5 has it
        return "unknown"
    try:
        value = choose(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **_gqa(q, k))
    except RuntimeError:  # "No viable backend": SDPA itself would raise the same
        return "none"
    try:
        name = _BACKEND_NAMES.get(SDPBackend(value).name, SDPBackend(value).name.lower())
    except ValueError:
        return "unknown"
    return "flash-cpu" if name == "flash" and q.device.type == "cpu" else name


def _layout(t: Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def sdpa_backend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> str:
    """The backend SDPA runs this call on here and now (``torch._fused_sdp_choice`` under the enabled
    backends), plus what a mask rules out, e.g. ``"math (the mask rules out flash-cpu)"``. Cached per
    call signature."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    key = (_layout(q), _layout(k), _layout(v), q.device, _layout(attn_mask), is_causal, grad,
           _enabled_backends())
    if key in _backend_cache:
        _backend_cache.move_to_end(key)
        return _backend_cache[key]
    backend = _choice(q, k, v, attn_mask, is_causal)
    if attn_mask is not None and backend != "none":
        unmasked = _choice(q, k, v, None, is_causal)
        if unmasked not in (backend, "none", "unknown"):
            backend = f"{backend} (the mask rules out {unmasked})"
    _backend_cache[key] = backend
    while len(_backend_cache) > MAX_CACHED_BACKENDS:
        _backend_cache.popitem(last=False)
    return backend


def _note(q: Tensor, k: Tensor) -> str:
    return gqa_note(q.shape[1], k.shape[1], "native enable_gqa")


@dataclass(frozen=True)
class _CachedMask:
    """An additive mask ``(1, H|1, Nq, Nk)`` and its rows with no allowed key ``(1, H|1, Nq, 1)``."""

    additive: Tensor
    empty_rows: Tensor | None
    with_bias: bool

    @property
    def nbytes(self) -> int:
        extra = 0 if self.empty_rows is None else self.empty_rows.numel()
        return self.additive.numel() * self.additive.element_size() + extra


def _bias(pattern: Pattern, batch: int, heads: int, q_len: int, k_len: int, dtype: torch.dtype,
          device: torch.device) -> Tensor:
    """The score_mod evaluated on zeros, as it broadcasts: ``(B|1, H|1, Nq|1, Nk|1)``."""
    b, h, i, j = index_grids(batch, heads, q_len, k_len, device)
    zeros = torch.zeros((), dtype=dtype, device=device)
    return pattern.score_mod(zeros, b, h, i, j).to(dtype)


def _mask_heads(pattern: Pattern, heads: int) -> int:
    """Heads of the cached pattern: ``H`` when the mask depends on the head, else 1 (shared)."""
    return heads if pattern.per_head else 1


def _build(pattern: Pattern, heads: int, q_len: int, k_len: int, causal: bool,
           dtype: torch.dtype, device: torch.device, with_bias: bool) -> _CachedMask:
    mask_heads = _mask_heads(pattern, heads)
    allowed = dense_allowed(pattern.mask_mod, batch=1, heads=mask_heads, q_len=q_len, k_len=k_len,
                            causal=causal, key_mask=None, device=device)  # (1, H|1, Nq, Nk) | None
    additive = torch.zeros(1, mask_heads, q_len, k_len, dtype=dtype, device=device)
    if with_bias:
        additive = _bias(pattern, 1, heads, q_len, k_len, dtype, device).expand(1, -1, q_len, k_len).clone()
    empty_rows = None
    if allowed is not None:
        additive.masked_fill_(~allowed, float("-inf"))
        empty = ~allowed.any(dim=-1, keepdim=True)  # (1, H|1, Nq, 1)
        if bool(empty.any()):
            additive.masked_fill_(empty, 0.0)  # keep SDPA away from all -inf rows; zeroed after
            empty_rows = empty
    return _CachedMask(additive, empty_rows, with_bias)


class SdpaKernel(Kernel):
    """PyTorch SDPA; fused for full/causal, a cached materialised mask otherwise."""

    name = "sdpa"
    adds_score_as_bias = True
    supports_document_ids = True  # a dense mask of the documents, built per call
    description = "torch scaled_dot_product_attention (is_causal, or a mask built once per shape)"

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary[PatternOwner, OrderedDict[tuple, _CachedMask]] = (
            weakref.WeakKeyDictionary()
        )

    def _mask(self, pattern: Pattern, q: Tensor, k_len: int, causal: bool
              ) -> tuple[_CachedMask, float | None]:
        """The cached mask for this call's shape, and the build time when built now."""
        heads, q_len = q.shape[1], q.shape[2]
        # a score_mod without trainable tensors (ALiBi) is cached with the mask
        with_bias = pattern.score_mod is not None and not any(p.requires_grad for p in pattern.score_params)
        mask_heads = heads if with_bias else _mask_heads(pattern, heads)
        key = (mask_heads, q_len, k_len, causal, q.dtype, q.device, with_bias)
        per_module = self._cache.setdefault(pattern.owner, OrderedDict())
        if key in per_module:
            per_module.move_to_end(key)
            return per_module[key], None
        start = time.perf_counter()
        mask = _build(pattern, heads, q_len, k_len, causal, q.dtype, q.device, with_bias)
        per_module[key] = mask
        while len(per_module) > MAX_CACHED_SHAPES:
            per_module.popitem(last=False)
        return mask, time.perf_counter() - start

    def _key_padding_only(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor
                          ) -> tuple[Tensor, KernelPath]:
        """Full attention over the real keys: a broadcast ``(B, 1, 1, Nk)`` mask, no ``Nq x Nk``."""
        attn_mask = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device)
        attn_mask.masked_fill_(~key_mask, float("-inf"))
        empty = ~key_mask.any(dim=-1)  # (B,) rows of a batch element with no real key
        attn_mask[empty] = 0.0
        attn_mask = attn_mask[:, None, None, :]  # (B, 1, 1, Nk)
        out = _sdpa(q, k, v, attn_mask=attn_mask)
        # on an accelerator always: reading ``empty.any()`` on the host would sync per call
        if not host_reads_are_free(q.device) or bool(empty.any()):
            out = out.masked_fill(empty[:, None, None, None], 0.0)
        return out, KernelPath(self.name, "sdpa(key padding mask (B, 1, 1, Nk))" + _note(q, k),
                               backend=sdpa_backend(q, k, v, attn_mask))

    def _packed(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        """A packed call: the documents' dense ``(B, H|1, N, N)`` mask, built per call (it depends on data)."""
        batch, heads, length = q.shape[0], q.shape[1], q.shape[2]
        allowed = dense_allowed(pattern.mask_mod, batch=batch, heads=_mask_heads(pattern, heads),
                                q_len=length, k_len=length, causal=causal, key_mask=key_mask,
                                device=q.device)  # (B, H|1, N, N)
        attn_mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
        if pattern.score_mod is not None:
            attn_mask = attn_mask + _bias(pattern, batch, heads, length, length, q.dtype, q.device)  # (B, H, N, N)
        empty = ~allowed.any(dim=-1, keepdim=True)  # (B, H|1, N, 1) rows with no allowed key
        attn_mask = attn_mask.masked_fill(empty, 0.0)
        out = _sdpa(q, k, v, attn_mask=attn_mask).masked_fill(empty, 0.0)  # (B, H, N, Dv)
        return out, KernelPath(self.name, "sdpa(dense mask of the documents, built per call)" + _note(q, k),
                               mask_emulated=True, backend=sdpa_backend(q, k, v, attn_mask))

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        if pattern.documents is not None:
            return self._packed(pattern, q, k, v, causal, key_mask)
        q_len, k_len = q.shape[2], k.shape[2]
        mask_mod, score_mod = pattern.mask_mod, pattern.score_mod
        if mask_mod is None and score_mod is None and key_mask is None:
            if not causal:
                return _sdpa(q, k, v), KernelPath(
                    self.name, "sdpa(fused, no mask)" + _note(q, k), backend=sdpa_backend(q, k, v))
            if q_len == k_len:
                out = _sdpa(q, k, v, is_causal=True)
                return out, KernelPath(self.name, "sdpa(fused, is_causal)" + _note(q, k),
                                       backend=sdpa_backend(q, k, v, is_causal=True))
        if mask_mod is None and score_mod is None and not causal:  # padding only: (B, 1, 1, Nk)
            return self._key_padding_only(q, k, v, key_mask)
        cached, built_s = self._mask(pattern, q, k_len, causal)
        attn_mask, empty_rows = cached.additive, cached.empty_rows
        kind = "cached float mask per head" if pattern.per_head else "cached float mask"
        path = f"sdpa({kind}" + (" with the position bias)" if cached.with_bias else ")")
        if score_mod is not None and not cached.with_bias:  # learned bias: per call, with grad
            bias = _bias(pattern, 1, q.shape[1], q_len, k_len, q.dtype, q.device)
            attn_mask = attn_mask + bias.expand(1, -1, q_len, k_len)
            path = f"sdpa({kind} + learned bias per call)"
        if key_mask is not None:
            attn_mask = attn_mask.masked_fill(~key_mask[:, None, None, :], float("-inf"))
            emptied = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)  # (B, H|1, Nq, 1)
            attn_mask = attn_mask.masked_fill(emptied, 0.0)
            empty_rows = emptied if empty_rows is None else emptied | empty_rows
        out = _sdpa(q, k, v, attn_mask=attn_mask)
        if empty_rows is not None:
            out = out.masked_fill(empty_rows, 0.0)
        setup = {} if built_s is None else {"setup_s": built_s, "setup_bytes": cached.nbytes}
        return out, KernelPath(self.name, path + _note(q, k), mask_emulated=True,
                               backend=sdpa_backend(q, k, v, attn_mask), **setup)
