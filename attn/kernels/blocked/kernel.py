""":func:`blocked_attention` (global rows, band rows) and the :class:`BlockedKernel`."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import gqa_note
from attn.kernels.base import Band, Kernel, KernelPath
from attn.kernels.blocked.core import banded_attention
from attn.kernels.blocked.dense import global_row_attention, global_rows, key_span_attention, uses_key_span
from attn.kernels.blocked.flash import flash_note
from attn.kernels.blocked.packed import packed_attention
from attn.kernels.chunked import chunked_attention
from attn.mods import ScoreMod
from attn.pattern import Pattern
from attn.precision import without_autocast


@without_autocast
def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Band,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    score_mod: ScoreMod | None = None,
    block: int | None = None,
    chunk: int | None = None,
) -> Tensor:
    """Exact banded attention (sliding window, dilated, global tokens) in O(N*w) time.

    ``q (B, H, Nq, D)``, ``k (B, H_kv, Nk, D)``, ``v (B, H_kv, Nk, Dv)`` -> ``(B, H, Nq, Dv)``;
    positions bottom-right aligned; with ``H_kv < H`` the streams of a key head's query heads
    read its rows (grouped-query attention, no copy). ``block`` (query rows per block) and ``chunk`` (blocks per
    chunk) override the tuned defaults. A per-head band (:attr:`Band.group_dilations`) runs
    each run of heads of one dilation with its own uniform band (views of the heads, the
    score_mod told their true head index) and concatenates the outputs along H.
    """
    if band.per_head:
        outs = []
        for h0, h1, group in band.head_groups(q.shape[1]):
            k_heads, v_heads = _key_heads(k, q.shape[1], h0, h1), _key_heads(v, q.shape[1], h0, h1)
            outs.append(blocked_attention(
                q[:, h0:h1], k_heads, v_heads, group, causal=causal, key_mask=key_mask,
                score_mod=_heads_from(score_mod, h0), block=block, chunk=chunk,
            ))  # (B, h1 - h0, Nq, Dv)
        return torch.cat(outs, dim=1)  # (B, H, Nq, Dv)
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    dtype = q.dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    q_len, k_len = q.shape[2], k.shape[2]
    offset = k_len - q_len  # position of query row 0
    n_global_rows = global_rows(q_len, k_len, band.num_global)
    band_out = None  # (B, H, Nq - n_global_rows, Dv)
    if n_global_rows < q_len:
        if not uses_key_span(q_len - n_global_rows, band, block):
            # the global rows computed inside the core, into the same output: no concatenation
            return banded_attention(q, k, v, band, causal=causal, q_offset=offset, key_mask=key_mask,
                                    score_mod=score_mod, block=block, chunk=chunk,
                                    global_rows=n_global_rows).to(dtype)
        band_out = key_span_attention(q[:, :, n_global_rows:], k, v, band, causal=causal,
                                      q_offset=offset + n_global_rows, key_mask=key_mask, score_mod=score_mod)
    if n_global_rows == 0:
        result = band_out
    else:
        global_out = global_row_attention(q[:, :, :n_global_rows], k, v, causal=causal, q_offset=offset,
                                          key_mask=key_mask, score_mod=score_mod)  # (B, H, n_global_rows, Dv)
        result = global_out if band_out is None else torch.cat([global_out, band_out], dim=2)
    return result.to(dtype)


def _key_heads(x: Tensor, heads: int, h0: int, h1: int) -> Tensor:
    """The key heads ``x (B, H_kv, Nk, .)`` that query heads ``[h0, h1)`` read, laid out so that
    the slice's own grouping (``(h1 - h0) / H_kv'`` query heads per key head) holds: a view when
    the slice covers whole groups or lies inside one, else the heads gathered one per query head."""
    kv_heads = x.shape[1]
    groups = heads // kv_heads
    if groups == 1:
        return x[:, h0:h1]
    if h0 // groups == (h1 - 1) // groups:  # inside one group: one key head for the slice
        return x[:, h0 // groups : h0 // groups + 1]
    if h0 % groups == 0 and h1 % groups == 0:  # whole groups
        return x[:, h0 // groups : h1 // groups]
    return x[:, torch.arange(h0, h1, device=x.device) // groups]  # (B, h1 - h0, Nk, .)


def _heads_from(score_mod: ScoreMod | None, first: int) -> ScoreMod | None:
    """``score_mod`` for a slice of heads starting at head ``first`` (its head 0 is ``first``)."""
    if score_mod is None or first == 0:
        return score_mod

    def shifted(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return score_mod(score, b, h + first, i, j)

    return shifted


class BlockedKernel(Kernel):
    """Banded blocks in pure PyTorch: O(N*w) time, O(N) extra memory, autograd, any device."""

    name = "blocked"
    adds_score_as_bias = True
    computes_half_in_float32 = True
    supports_document_ids = True  # each document its own call (attn.kernels.blocked.packed)
    description = ("banded query/key blocks (sliding window, dilated, global tokens), O(N*w); "
                   "packed calls per document")

    def not_supported_reasons(self, pattern: Pattern, call: AttentionCall | None = None) -> list[str]:
        if reasons := super().not_supported_reasons(pattern, call):
            return reasons
        if pattern.band is None and pattern.mask_mod is not None:
            return [f"{pattern.name} has no banded structure (band() is None)"]
        if pattern.band is None and call is not None and not call.has_document_ids:
            return [f"{pattern.name} has no banded structure (band() is None); blocked runs it on "
                    "packed calls only (document_ids), one dense product per document"]
        return []

    def run(self, pattern: Pattern, q: Tensor, k: Tensor, v: Tensor, causal: bool,
            key_mask: Tensor | None) -> tuple[Tensor, KernelPath]:
        if pattern.documents is not None and pattern.within is not None:
            out, path = packed_attention(pattern.within, pattern.documents, q, k, v, causal, key_mask)
            return out, KernelPath(self.name, path + gqa_note(
                q.shape[1], k.shape[1], "each document's call takes the grouped heads as an unpacked call does"))
        band = pattern.band
        if band is None:  # declared above; kept for direct calls
            raise NotImplementedError(f"{pattern.name}: kernel 'blocked' needs a band; band() is None")
        score_mod = pattern.score_mod
        q_len, k_len = q.shape[2], k.shape[2]
        n_neg = max(q_len - k_len, 0)  # rows at negative absolute positions (Nq > Nk)
        fallback = None
        out = blocked_attention(
            q[:, :, n_neg:], k, v, band, causal=causal, key_mask=key_mask, score_mod=score_mod
        )  # (B, H, Nq - n_neg, Dv)
        if n_neg:
            # a variant's rule at negative positions is its own (e.g. global_tokens: i < g
            # holds for every i < 0); compute those rows exactly from the mask_mod
            head = chunked_attention(
                q[:, :, :n_neg], k, v, mask_mod=pattern.mask_mod, score_mod=score_mod,
                score_params=pattern.score_params, causal=causal, key_mask=key_mask,
                q_offset=k_len - q_len,
            )  # (B, H, n_neg, Dv)
            out = torch.cat([head, out], dim=2)
            fallback = f"{n_neg} query rows at negative positions (Nq > Nk) computed by chunked"
        path = _path(band, q_len - n_neg, k_len, q.shape[1])
        if "banded blocks" in path:
            path += flash_note(q, v, band.num_global, score_mod is not None)
        path += gqa_note(
            q.shape[1], k.shape[1], "native (the streams of a group read its key head, no copy)")
        return out, KernelPath(self.name, path, fallback=fallback)


def _path(band: Band, q_len: int, k_len: int, heads: int) -> str:
    """The ``KernelPath.path`` of a call of ``q_len`` rows at non-negative positions."""
    if band.per_head:
        groups = [f"heads {h0}-{h1 - 1}: {_path(group, q_len, k_len, h1 - h0)}"
                  for h0, h1, group in band.head_groups(heads)]
        return f"per-head dilation groups [{'; '.join(groups)}]"
    parts = [f"w={band.window}"]
    if band.dilation > 1:
        parts.append(f"residues r={band.dilation}")
    if band.num_global:
        parts.append(f"g={band.num_global} dense rows/cols")
    band_rows = q_len - global_rows(q_len, k_len, band.num_global)
    if uses_key_span(band_rows, band):
        return f"dense over the band's key span, Nq <= one block ({', '.join(parts)})"
    return f"banded blocks ({', '.join(parts)})"
