"""The :class:`BlockedKernel`: banded patterns through :func:`~attn.kernels.blocked.attention.blocked_attention`."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.call import AttentionCall
from attn.gqa import gqa_note
from attn.kernels.base import Band, Kernel, KernelPath
from attn.kernels.blocked.attention import blocked_attention
from attn.kernels.blocked.dense import global_rows, uses_key_span
from attn.kernels.blocked.flash import flash_note
from attn.kernels.blocked.packed import packed_attention
from attn.kernels.chunked import chunked_attention
from attn.pattern import Pattern
from attn.precision import without_autocast


@without_autocast
class BlockedKernel(Kernel):
    """Banded blocks in pure PyTorch: O(N*w) time, O(N) extra memory, autograd, any device."""

    name = "blocked"
    adds_score_as_bias = True
    computes_half_in_float32 = True
    supports_document_ids = True  # each document its own call (attn.kernels.blocked.packed)
    description = ("banded query/key blocks (sliding window, dilated, global tokens), O(N*w); "
                   "packed calls per document")
    CUDA_MAX_KEYS = 65_536  # float32 blocks in a Python loop of launches that grows with N

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
