"""Packed sequences: several documents in one row, ``document_ids (B, N)`` (docs/contract.md, "Packed sequences")."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import Tensor

from attn.mods import MaskMod, ScoreMod


def check_document_ids(name: str, document_ids: object, *, batch: int, q_len: int, k_len: int,
                       device: torch.device) -> None:
    """``ValueError`` naming ``name`` unless ``document_ids`` is an integer ``(B, N)`` tensor on ``device``,
    non-decreasing along each row, in a self-attention call. Reads the ids on the host."""
    subject = f"{name}: argument 'document_ids'"
    if not isinstance(document_ids, Tensor):
        raise ValueError(f"{subject} must be an integer tensor (B, N) or None; got {type(document_ids).__name__}")
    if document_ids.dtype == torch.bool or document_ids.is_floating_point() or document_ids.is_complex():
        raise ValueError(f"{subject} must have an integer dtype (torch.int32 / torch.int64); "
                         f"got {document_ids.dtype}")
    if q_len != k_len:
        raise ValueError(f"{subject} needs self-attention (Nq == Nk); got Nq={q_len}, Nk={k_len} "
                         "(cross-attention and KV-cache decoding take no document_ids)")
    if tuple(document_ids.shape) != (batch, k_len):
        raise ValueError(f"{subject} must have shape (B, N) = ({batch}, {k_len}); "
                         f"got {tuple(document_ids.shape)}")
    if document_ids.device != device:
        raise ValueError(f"{subject} is on {document_ids.device} but 'q' is on {device}; "
                         "they must be on one device")
    if k_len > 1 and not bool((document_ids[:, 1:] >= document_ids[:, :-1]).all()):
        raise ValueError(f"{subject} must be non-decreasing along each row (each document "
                         "contiguous); got a row whose ids decrease")


@dataclass(frozen=True, eq=False)
class Documents:
    """The documents of a packed call: ``ids (B, N)`` int64 and each token's document start ``starts``."""

    ids: Tensor
    starts: Tensor

    @classmethod
    def from_ids(cls, document_ids: Tensor) -> Documents:
        """The documents of validated ids (:func:`check_document_ids`)."""
        ids = document_ids.to(torch.int64)  # (B, N)
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device).expand_as(ids)  # (B, N)
        first = torch.ones_like(ids, dtype=torch.bool)
        first[:, 1:] = ids[:, 1:] != ids[:, :-1]  # (B, N) True at each document's first token
        starts = torch.where(first, positions, torch.zeros_like(positions)).cummax(dim=1).values
        return cls(ids, starts)

    def segments(self) -> list[list[tuple[int, int]]]:
        """Per row, the documents as ``[start, end)`` ranges in order (read on the host)."""
        ids = self.ids.cpu()
        rows = []
        for row in ids:
            cut = (torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()
            bounds = [0, *cut, row.shape[0]]
            rows.append(list(pairwise(bounds)))
        return rows


def packed_mods(documents: Documents, mask_mod: MaskMod | None, score_mod: ScoreMod | None
                ) -> tuple[MaskMod, ScoreMod | None]:
    """The packed forms of a pattern's mods: pairs within one document, at document-local positions."""
    ids, starts = documents.ids, documents.starts

    def local(b: Tensor, i: Tensor, j: Tensor) -> tuple[Tensor, Tensor]:
        return i - starts[b, i], j - starts[b, j]  # (B, 1, Nq, 1), (B, 1, 1, Nk)

    def packed_mask(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        same = ids[b, i] == ids[b, j]  # (B, 1, Nq, Nk)
        if mask_mod is None:
            return same
        li, lj = local(b, i, j)
        return same & mask_mod(b, h, li, lj)

    packed_score = None
    if score_mod is not None:

        def packed_score(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            li, lj = local(b, i, j)
            return score_mod(score, b, h, li, lj)

    return packed_mask, packed_score
