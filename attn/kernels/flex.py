"""The ``flex`` kernel: ``flex_attention`` compiled from the variant's mods (docs/kernels.md; padding, buckets and
fallbacks: docs/gpu.md). Compiled code is cached per (pattern key, padded shape) in a bucket with its own code
object, shared across modules when ``Pattern.shared``, else per owner; an out-of-memory error always propagates."""

from __future__ import annotations

import time
import types
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attn.call import AttentionCall
from attn.devices import synchronize
from attn.gqa import gqa_note
from attn.kernels.base import Kernel, KernelPath
from attn.kernels.block_masks import Structure, structured_block_mask
from attn.mods import MaskMod, ScoreMod, and_masks, causal_mask_mod
from attn.oom import is_oom_error
from attn.pattern import Pattern, PatternOwner

BLOCK = 128
#: a block mask without a ``key_mask`` of at most this many dense elements is built eagerly (~10 ms,
#: against ~2.5 s to compile it per shape)
EAGER_MASK_ELEMENTS = 1 << 15
#: the CPU C++ template's ``q @ k.T`` micro-kernel width, which CPU lengths are padded to
ALIGN = 16


def _fresh(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object (its own dynamo cache and recompile budget)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def block_mask_bytes(block_mask: Any) -> int:
    """Bytes of the tensors a block mask holds (block counts and indices)."""
    return sum(t.numel() * t.element_size() for t in block_mask.as_tuple()
               if isinstance(t, Tensor))


def _flex_call(q, k, v, score_mod, block_mask, scale):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          enable_gqa=q.shape[1] != k.shape[1])


def _mask_call(mask_mod, batch, heads, q_len, k_len, device):
    return create_block_mask(mask_mod, batch, heads, q_len, k_len, device=device, BLOCK_SIZE=BLOCK)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


#: bucket steps divide the key length by at most this (a bucket pads under 1/8 of its keys)
BUCKET_FRACTION_BITS = 3


def key_bucket(k_len: int, device: torch.device) -> int:
    """``k_len`` rounded up to a multiple of a power of two >= ``k_len / 16`` (under 12.5% padding),
    at least :data:`ALIGN` on CPU and :data:`BLOCK` elsewhere."""
    smallest = ALIGN if device.type == "cpu" else BLOCK
    step = max(smallest, 1 << max(k_len.bit_length() - 1 - BUCKET_FRACTION_BITS, 0))
    return _round_up(k_len, step)


def padded_lengths(q_len: int, k_len: int, device: torch.device) -> tuple[int, int]:
    """The ``(Nq, Nk)`` a call runs at: keys in their bucket; on CPU queries of >= ``ALIGN`` rows aligned."""
    k_pad = key_bucket(k_len, device)
    if device.type != "cpu":
        return q_len, k_pad
    return (q_len if q_len < ALIGN else _round_up(q_len, ALIGN)), k_pad


def _wrap_mods(
    pattern: Pattern, causal: bool, lengths: Tensor | tuple[int, int, int], key_mask_buf: Tensor | None
) -> tuple[MaskMod, ScoreMod | None, bool]:
    """FlexAttention mods for ``pattern``, and True when every pair is allowed.

    ``lengths`` is ``(Nq, Nk, Nk - Nq)``: ints baked into unpadded code, or a tensor refilled per
    call; then padded keys are masked and positions clamped so the mods never see the padding."""
    base = and_masks(pattern.mask_mod, causal_mask_mod if causal else None)
    score = pattern.score_mod
    padded = isinstance(lengths, Tensor)

    def positions(q_idx: Tensor, kv_idx: Tensor) -> tuple[Tensor, Tensor]:
        if not padded:
            return q_idx + lengths[2], kv_idx
        last = lengths[1] - 1
        return torch.minimum(q_idx + lengths[2], last), torch.minimum(kv_idx, last)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        # a tensor in every branch; padded keys are never attended
        ok = kv_idx < lengths[1] if padded else q_idx >= 0
        if base is not None:
            i, j = positions(q_idx, kv_idx)
            ok = ok & base(b, h, i, j)
        if key_mask_buf is not None:
            ok = ok & key_mask_buf[b, kv_idx]
        return ok

    score_mod = None
    if score is not None:

        def score_mod(s: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            i, j = positions(q_idx, kv_idx)
            return score(s, b, h, i, j)

    return mask_mod, score_mod, base is None and key_mask_buf is None


@dataclass
class _Bucket:
    """Everything cached for one (padded) call shape of one pattern key."""

    lengths: Tensor | None  # int64 (3,): Nq, Nk, Nk - Nq of the current call; None: unpadded
    key_mask_buf: Tensor | None  # bool (B, padded Nk), refilled per call
    mask_mod: MaskMod
    score_mod: ScoreMod | None
    all_allowed: bool
    flex: Callable[..., Tensor]
    make_mask: Callable[..., Any]
    causal: bool = False
    structure: Structure | None = None  # read the block mask from it (else from the mask_mod)
    compile_failed: str | None = None  # why compiling flex failed here: every later call eager
    per_head: bool = False  # the mask depends on the head: one block mask per head (H, not None)
    block_masks: dict[tuple[int, int], Any] = field(default_factory=dict)  # per exact (Nq, Nk)
    seen: set[tuple[int, int]] = field(default_factory=set)
    current: tuple[int, int] | None = None  # the (Nq, Nk) that ``lengths`` holds


class FlexKernel(Kernel):
    """Compiled FlexAttention with cached block masks and per-bucket compiled functions."""

    compiles_per_shape = True
    name = "flex"
    description = "torch flex_attention compiled (block-sparse), block masks cached per shape"

    def __init__(self) -> None:
        self._by_owner: weakref.WeakKeyDictionary[PatternOwner, dict[Hashable, dict[tuple, _Bucket]]] = (
            weakref.WeakKeyDictionary()
        )
        self._by_key: dict[Hashable, dict[tuple, _Bucket]] = {}

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        reasons = super().not_supported_reasons(pattern, call)
        if call is not None and call.device.type == "cpu":
            if call.requires_grad:
                reasons.append("flex has no backward on CPU in this torch (forward only)")
            if call.dtype == torch.float64:
                reasons.append("flex on CPU supports float32/float16/bfloat16, not float64")
        return reasons

    def _buckets_of(self, pattern: Pattern) -> dict[tuple, _Bucket]:
        """The buckets of ``pattern``'s key: shared when the key is plain values, else per owner."""
        if pattern.shared:
            return self._by_key.setdefault(pattern.key, {})
        return self._by_owner.setdefault(pattern.owner, {}).setdefault(pattern.key, {})

    def _bucket(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                key_mask: Tensor | None) -> _Bucket:
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        q_pad, k_pad = padded_lengths(q_len, k_len, q.device)
        padded = (q_pad, k_pad) != (q_len, k_len)  # unpadded calls get exact code of their own
        key = (batch, heads, q_pad, k_pad, dim, v.shape[-1], q.dtype, q.device, causal,
               key_mask is not None, k.shape[1], padded)
        buckets = self._buckets_of(pattern)
        if key in buckets:
            return buckets[key]
        shared = (*key[:-1], True)  # the padded bucket of these lengths, if one was compiled:
        if not padded and shared in buckets:  # a decoding step landing on its edge reuses it
            return buckets[shared]
        lengths = torch.zeros(3, dtype=torch.int64, device=q.device) if padded else None
        buf = None if key_mask is None else torch.zeros(batch, k_pad, dtype=torch.bool, device=q.device)
        exact = (q_len, k_len, k_len - q_len)
        mask_mod, score_mod, all_allowed = _wrap_mods(pattern, causal, exact if lengths is None else lengths, buf)
        kv = f"kv{k.shape[1]}" if k.shape[1] != heads else ""
        tag = f"{batch}x{heads}{kv}x{q_pad}x{k_pad}x{dim}{'_padded' if padded else ''}"
        per_head = pattern.per_head
        # a head-dependent mask breaks Inductor's vectorised C++ codegen (VecMask<int>/<float> mix g++
        # rejects, torch 2.13): compile it as scalar C++ rather than build it eagerly (O(H*Nq*Nk))
        mask_options = {"cpp.simdlen": 1} if per_head and q.device.type == "cpu" else None
        buckets[key] = _Bucket(
            lengths=lengths, key_mask_buf=buf, mask_mod=mask_mod, score_mod=score_mod,
            all_allowed=all_allowed, per_head=per_head, causal=causal,
            structure=Structure.of(pattern),
            flex=torch.compile(_fresh(_flex_call, f"flex_call_{tag}"), dynamic=False, fullgraph=True),
            make_mask=torch.compile(_fresh(_mask_call, f"block_mask_call_{tag}"), dynamic=False,
                                    options=mask_options),
        )
        return buckets[key]

    def _block_mask(self, bucket: _Bucket, shape: tuple[int, int], q: Tensor, k: Tensor
                    ) -> tuple[Any, bool, str | None]:
        """The block mask of this shape, whether this call built it, and the fallback taken (or None)."""
        if shape in bucket.block_masks:
            return bucket.block_masks[shape], False, None
        q_pad, k_pad = q.shape[2], k.shape[2]
        if bucket.structure is not None:  # banded, factorised or unmasked: eager, from the band
            block_mask = structured_block_mask(
                bucket.structure, bucket.mask_mod, causal=bucket.causal, q_len=shape[0],
                k_len=shape[1], q_pad=q_pad, k_pad=k_pad, heads=q.shape[1], block=BLOCK,
                device=q.device, key_mask=bucket.key_mask_buf is not None)
            bucket.block_masks[shape] = block_mask
            return block_mask, True, None
        batch = q.shape[0] if bucket.key_mask_buf is not None else None
        heads = q.shape[1] if bucket.per_head else None  # None: one block mask shared by the heads
        fallback = None
        if bucket.key_mask_buf is None and (heads or 1) * q_pad * k_pad <= EAGER_MASK_ELEMENTS:
            block_mask = create_block_mask(
                bucket.mask_mod, None, heads, q_pad, k_pad, device=q.device, BLOCK_SIZE=BLOCK
            )  # small and built once per shape: eager beats a compile
            bucket.block_masks[shape] = block_mask
            return block_mask, True, None
        try:
            block_mask = bucket.make_mask(bucket.mask_mod, batch, heads, q_pad, k_pad, q.device)
        except Exception as err:
            if is_oom_error(err):
                raise  # an oom row, never an eager O(N^2) build
            fallback = f"block mask built eagerly (O(N^2)): {type(err).__name__}: {err}"[:300]
            block_mask = create_block_mask(
                bucket.mask_mod, batch, heads, q_pad, k_pad, device=q.device, BLOCK_SIZE=BLOCK
            )
        if bucket.key_mask_buf is None:  # else it depends on this call's data
            bucket.block_masks[shape] = block_mask
        return block_mask, True, fallback

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        bucket = self._bucket(pattern, q, k, v, causal, key_mask)
        q_len, k_len = q.shape[2], k.shape[2]
        shape = (q_len, k_len)
        first = shape not in bucket.seen
        synchronize(q.device)  # the timings below count this call's work only
        start = time.perf_counter()
        if bucket.lengths is not None and bucket.current != shape:
            bucket.lengths.copy_(torch.tensor([q_len, k_len, k_len - q_len]))
            bucket.current = shape
        if bucket.key_mask_buf is not None:
            bucket.key_mask_buf[:, :k_len].copy_(key_mask)  # (B, Nk); the padding is masked anyway
        q_pad, k_pad = padded_lengths(q_len, k_len, q.device)
        q_in = F.pad(q, (0, 0, 0, q_pad - q_len)) if q_pad > q_len else q  # (B, H, padded Nq, D)
        k_in, v_in = (F.pad(t, (0, 0, 0, k_pad - k_len)) if k_pad > k_len else t for t in (k, v))
        dense = bucket.all_allowed and bucket.lengths is None  # every pair allowed: no block mask
        block_mask, built, setup, mask_fallback = None, False, {}, None
        if not dense:
            mask_start = time.perf_counter()
            block_mask, built, mask_fallback = self._block_mask(bucket, shape, q_in, k_in)
            if built and shape in bucket.block_masks:  # cached for later calls of this shape
                synchronize(q.device)
                setup = {"setup_s": time.perf_counter() - mask_start,
                         "setup_bytes": block_mask_bytes(block_mask)}
        out, flex_fallback = self._attend(bucket, q_in, k_in, v_in, block_mask)  # (B, H, padded Nq, Dv)
        out = out[:, :, :q_len] if q_pad > q_len else out  # (B, H, Nq, Dv)
        compile_s = None
        if first:
            synchronize(q.device)
            bucket.seen.add(shape)
            compile_s = time.perf_counter() - start - setup.get("setup_s", 0.0)
        path = "flex_attention(compiled)" if flex_fallback is None else "flex_attention"
        if bucket.per_head and not dense:
            path += ", block mask per head"
        path += gqa_note(q.shape[1], k.shape[1], "native enable_gqa")
        fallback = "; ".join(f for f in (mask_fallback, flex_fallback) if f) or None
        return out, KernelPath(self.name, path, fallback=fallback, compile_s=compile_s, **setup)

    @staticmethod
    def _attend(bucket: _Bucket, q: Tensor, k: Tensor, v: Tensor, block_mask: Any
                ) -> tuple[Tensor, str | None]:
        """Compiled flex and None; after a failed compile, eager flex and the fallback (OOM propagates)."""
        if bucket.compile_failed is None:
            try:
                return bucket.flex(q, k, v, bucket.score_mod, block_mask, None), None
            except Exception as err:  # graph break / recompile limit: eager from now on, flagged
                if is_oom_error(err):
                    raise
                bucket.compile_failed = f"{type(err).__name__}: {err}"
        fallback = f"eager flex_attention (compile failed: {bucket.compile_failed})"[:300]
        return flex_attention(q, k, v, score_mod=bucket.score_mod, block_mask=block_mask,
                              enable_gqa=q.shape[1] != k.shape[1]), fallback
