"""The ``xformers`` kernel: ``xformers.ops.memory_efficient_attention`` (imported lazily; CUDA only), full, causal
and sliding window through its bottom-right attn_bias classes (docs/kernels.md, docs/gpu.md)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import gqa_note
from attn.kernels.base import Kernel, KernelPath
from attn.pattern import Pattern


def load_xformers() -> tuple[ModuleType | None, str | None]:
    """``(xformers.ops, None)`` or ``(None, reason)``; never raises."""
    try:
        return importlib.import_module("xformers.ops"), None
    except Exception as err:  # any import failure is a "not supported" reason
        return None, f"xformers is not importable ({type(err).__name__}: {err})"


#: why a call with a ``key_mask`` is refused
KEY_MASK_REASON = ("argument 'key_mask' is not supported (its attn_bias classes have no padding form); "
                   "use kernel 'sdpa', 'blocked' or 'flex'")


#: dtypes xformers runs on its flash operator; any other (float32) runs cutlass only
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def cutlass_local_reason(pattern: Pattern, call: AttentionCall) -> str | None:
    """Why a sliding window call in a cutlass-only dtype is refused (the cutlass forward lacks the non-causal local
    mask, its backward the causal one: "infs/nans in the BW pass"), or None."""
    if pattern.band is None or call.dtype in FLASH_DTYPES:
        return None
    dtype = str(call.dtype).removeprefix("torch.")
    if not call.causal:
        return (f"{pattern.name}: in {dtype} only xformers' cutlass operator runs, and its forward "
                "has no non-causal local mask (LocalAttentionFromBottomRightMask); use float16/bfloat16")
    if call.requires_grad:
        return (f"{pattern.name}: in {dtype} only xformers' cutlass operator runs, and its backward "
                "has no causal local mask (LowerTriangularFromBottomRightLocalAttentionMask); use "
                "float16/bfloat16 or forward only")
    return None


def attn_bias_for(ops: Any, pattern: Pattern, causal: bool) -> tuple[Any, str]:
    """The ``xformers.ops.fmha.attn_bias`` object for this pattern, and a description."""
    bias_mod = ops.fmha.attn_bias
    band = pattern.band
    if band is None:
        if causal:
            return bias_mod.LowerTriangularFromBottomRightMask(), "causal (bottom-right)"
        return None, "full"
    w = band.window
    if causal:
        return bias_mod.LowerTriangularFromBottomRightLocalAttentionMask(w + 1), f"causal local w={w}"
    return bias_mod.LocalAttentionFromBottomRightMask(window_left=w, window_right=w), f"local w={w}"


def to_bmghk(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, .)`` -> xformers' ``(B, N, H_kv, H/H_kv, .)``, k and v
    expanded with stride 0."""
    batch, heads = q.shape[:2]
    kv_heads, k_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    qx = q.transpose(1, 2).unflatten(2, (kv_heads, groups))  # (B, Nq, H_kv, G, D)
    kx, vx = (t.transpose(1, 2).unsqueeze(3).expand(batch, k_len, kv_heads, groups, t.shape[-1])
              for t in (k, v))  # (B, Nk, H_kv, G, .)
    return qx, kx, vx


class XformersKernel(Kernel):
    """xformers memory-efficient attention (CUDA only), lazily imported."""

    name = "xformers"
    description = "xformers memory_efficient_attention with attn_bias (causal, local, full)"
    SUPPORTED_DEVICES = ("cuda",)
    SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        if call is not None and call.device.type == "cuda" and not torch.cuda.is_available():
            reasons.append("CUDA is not available")  # pragma: no cover - needs a GPU
        if call is not None and call.has_key_mask:
            reasons.append(KEY_MASK_REASON)
        band = pattern.band
        if band is None and pattern.mask_mod is not None:  # (also any head-dependent mask)
            reasons.append(f"{pattern.name}: its mask has no xformers attn_bias form")
        if band is not None and band.per_head:
            reasons.append(f"{pattern.name}: per-head dilations (a mask that depends on the head) "
                           "have no xformers attn_bias")
        elif band is not None and (band.dilation != 1 or band.num_global != 0):
            reasons.append(f"{pattern.name}: dilated / global bands have no xformers attn_bias")
        elif band is not None and call is not None and (why := cutlass_local_reason(pattern, call)):
            reasons.append(why)  # a plain window whose support depends on the dtype
        if pattern.score_mod is not None:
            reasons.append(f"{pattern.name}: a position bias (score_mod) is not supported")
        if not reasons and call is not None:
            _, why = load_xformers()
            if why:
                reasons.append(why)
        return reasons

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        if key_mask is not None:  # declared above; kept for direct calls, which would ignore it
            raise NotImplementedError(f"{pattern.name}: kernel 'xformers' cannot run this call: {KEY_MASK_REASON}")
        ops, why = load_xformers()
        if ops is None:
            raise NotImplementedError(f"{pattern.name}: kernel 'xformers' unavailable: {why}")
        bias, desc = attn_bias_for(ops, pattern, causal)
        if k.shape[1] != q.shape[1]:  # grouped-query: xformers' 5-D form, keys not copied
            out = ops.memory_efficient_attention(*to_bmghk(q, k, v), attn_bias=bias)  # (B, Nq, H_kv, G, Dv)
            out = out.flatten(2, 3)  # (B, Nq, H, Dv)
            note = gqa_note(q.shape[1], k.shape[1], "native 5-D (B, N, G, H, D), k/v expanded (stride 0)")
        else:
            # (B, H, N, D) -> (B, N, H, D)
            qx, kx, vx = (t.transpose(1, 2) for t in (q, k, v))
            out = ops.memory_efficient_attention(qx, kx, vx, attn_bias=bias)  # (B, Nq, H, Dv)
            note = ""
        return out.transpose(1, 2), KernelPath(self.name, f"memory_efficient_attention({desc}){note}")
