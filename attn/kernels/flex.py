"""The ``flex`` kernel: ``torch.nn.attention.flex_attention`` compiled, from the variant's mods.

The variant's mask_mod / score_mod use absolute query positions (bottom-right aligned);
FlexAttention passes row indices, so both are wrapped with ``i = row + (Nk - Nq)``. Causal
and ``key_mask`` are folded into the mask_mod.

Caching (so a sweep never hits dynamo's recompile limit): one entry per (attention module,
B, H, Nq, Nk, D, Dv, dtype, device, causal, key_mask present), where modules without
parameters or buffers are identified by their class and hyper-parameters (so copies share
compiled code) and the others by identity (their mods close over their tensors), holding the wrapped mods,
the block mask (rebuilt only when a ``key_mask`` is given, since it depends on the data),
and a compiled function with its *own code object*: dynamo keys its cache and recompile
limit on the code object, so each entry compiles once and never evicts another. Compiles
use ``fullgraph=True``: a graph break or a recompile-limit hit raises instead of silently
running the ~50x slower eager path; the kernel then runs eager flex on purpose and records
``KernelPath.fallback``. The first call of an entry records its compile time in
``KernelPath.compile_s`` (block-mask build + compile + first run) so it can be reported apart.

Limits (declared by :meth:`FlexKernel.supports`): no backward on CPU (torch has no CPU
flex backward), float64 unsupported on CPU, approximate variants unsupported.
"""

from __future__ import annotations

import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attn.base import Attention, KernelPath
from attn.kernels.base import Kernel
from attn.mods import and_masks, causal_mask_mod

BLOCK = 128


def _fresh(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object (its own dynamo cache and recompile budget)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _flex_call(q, k, v, score_mod, block_mask, scale):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _mask_call(mask_mod, batch, heads, q_len, k_len, device):
    return create_block_mask(mask_mod, batch, heads, q_len, k_len, device=device, BLOCK_SIZE=BLOCK)


@dataclass
class _Entry:
    """Everything cached for one call shape of one attention module."""

    mask_mod: Callable[..., Tensor]
    score_mod: Callable[..., Tensor] | None
    key_mask_buf: Tensor | None
    base_mask: Callable[..., Tensor] | None
    flex: Callable[..., Tensor]
    make_mask: Callable[..., Any]
    block_mask: Any = None
    compiled: bool = False
    fallback: str | None = None
    stats: dict[str, float] = field(default_factory=dict)


class FlexKernel(Kernel):
    """Compiled FlexAttention with cached block masks and per-shape compiled functions."""

    compiles_per_shape = True
    name = "flex"
    description = "torch flex_attention compiled (block-sparse), block masks cached per shape"

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary[Attention, dict[tuple, _Entry]] = (
            weakref.WeakKeyDictionary()
        )
        self._shared: dict[tuple[type, str], dict[tuple, _Entry]] = {}

    def supports(self, attention, device, dtype, causal, requires_grad) -> list[str]:
        reasons = self.exactness_reasons(attention)
        if torch.device(device).type == "cpu":
            if requires_grad:
                reasons.append("flex has no backward on CPU in this torch (forward only)")
            if dtype == torch.float64:
                reasons.append("flex on CPU supports float32/float16/bfloat16, not float64")
        return reasons

    def _entry(self, attention: Attention, q: Tensor, k: Tensor, v: Tensor, causal: bool,
               key_mask: Tensor | None) -> _Entry:
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        key = (batch, heads, q_len, k_len, dim, v.shape[-1], q.dtype, q.device, causal,
               key_mask is not None)
        if any(True for _ in attention.parameters()) or any(True for _ in attention.buffers()):
            per_module = self._cache.setdefault(attention, {})  # mods close over its tensors
        else:  # pure hyper-parameters: copies of the module share compiled entries
            per_module = self._shared.setdefault((type(attention), attention.extra_repr()), {})
        if key in per_module:
            return per_module[key]
        offset = k_len - q_len
        base = and_masks(attention.mask_mod(), causal_mask_mod if causal else None)
        buf = None if key_mask is None else key_mask.clone()  # (B, Nk), refilled per call

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            ok = q_idx >= 0  # all True; a tensor so that every branch returns one
            if base is not None:
                ok = ok & base(b, h, q_idx + offset, kv_idx)
            if buf is not None:
                ok = ok & buf[b, kv_idx]
            return ok

        score = attention.score_mod()
        score_mod = None
        if score is not None:

            def score_mod(s: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return score(s, b, h, q_idx + offset, kv_idx)

        entry = _Entry(
            mask_mod=mask_mod, score_mod=score_mod, key_mask_buf=buf, base_mask=base,
            flex=torch.compile(_fresh(_flex_call, "flex_call"), dynamic=False, fullgraph=True),
            make_mask=torch.compile(_fresh(_mask_call, "block_mask_call"), dynamic=False),
        )
        per_module[key] = entry
        return entry

    def run(self, attention: Attention, q, k, v, causal, key_mask):
        entry = self._entry(attention, q, k, v, causal, key_mask)
        batch, _, q_len, _ = q.shape
        k_len = k.shape[2]
        first = not entry.compiled
        start = time.perf_counter()
        if entry.key_mask_buf is not None:
            entry.key_mask_buf.copy_(key_mask)
        dense = entry.base_mask is None and entry.key_mask_buf is None  # every pair allowed
        if not dense and (entry.block_mask is None or entry.key_mask_buf is not None):
            b = batch if entry.key_mask_buf is not None else None
            try:
                entry.block_mask = entry.make_mask(entry.mask_mod, b, None, q_len, k_len, q.device)
            except Exception as err:  # compile failure: build eagerly, say so
                entry.fallback = f"block mask built eagerly (O(N^2)): {type(err).__name__}"
                entry.block_mask = create_block_mask(
                    entry.mask_mod, b, None, q_len, k_len, device=q.device, BLOCK_SIZE=BLOCK
                )
        if entry.fallback is None or entry.fallback.startswith("block mask"):
            try:
                out = entry.flex(q, k, v, entry.score_mod, entry.block_mask, None)
            except Exception as err:  # graph break / recompile limit: eager, flagged
                entry.fallback = f"eager flex_attention (compile failed: {type(err).__name__}: {err})"[:300]
                out = flex_attention(q, k, v, score_mod=entry.score_mod, block_mask=entry.block_mask)
        else:
            out = flex_attention(q, k, v, score_mod=entry.score_mod, block_mask=entry.block_mask)
        compile_s = None
        if first:
            entry.compiled = True
            compile_s = time.perf_counter() - start
        path = "flex_attention(compiled)" if entry.fallback is None else "flex_attention"
        return out, KernelPath(self.name, path, fallback=entry.fallback, compile_s=compile_s)
