"""The packing and padding axes of a speed sweep (docs/measurement.md): a case's ``packing`` text and inputs."""

from __future__ import annotations

import torch
from torch import Tensor

#: the weights of the document lengths are uniform in [LOW, LOW + 1)
LENGTH_WEIGHT_LOW = 0.5
#: the seed of the document lengths (fixed: the same lengths in every run)
LENGTH_SEED = 0


def document_lengths(n: int, documents: int, seed: int = LENGTH_SEED) -> list[int]:
    """``documents`` lengths >= 1 summing to ``n``, from seeded weights in [0.5, 1.5)."""
    if not 1 <= documents <= n:
        raise ValueError(f"packing: must be between 1 and N={n} documents; got {documents}")
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(documents, generator=gen, dtype=torch.float64) + LENGTH_WEIGHT_LOW
    spare = n - documents  # every document has at least one token
    lengths = (weights / weights.sum() * spare).floor().to(torch.int64) + 1
    lengths[: n - int(lengths.sum())] += 1  # the rounding remainder, one token each
    return lengths.tolist()


def document_ids(lengths: list[int], batch: int, device: torch.device | str = "cpu") -> Tensor:
    """``document_ids (batch, sum(lengths))``, every row packed the same way."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (N,)
    return ids.expand(batch, -1).contiguous().to(device)  # (B, N)


def padding_mask(n: int, batch: int, pad_fraction: float, device: torch.device | str = "cpu") -> Tensor:
    """``key_mask (batch, n)``: the last ``round(pad_fraction * n)`` keys are padding (one stays real)."""
    real = max(1, n - round(pad_fraction * n))
    mask = torch.zeros(batch, n, dtype=torch.bool, device=device)  # (B, N)
    mask[:, :real] = True
    return mask


def packing_text(documents: int, one_by_one: bool, pad_fraction: float) -> str:
    """The ``packing`` column and label suffix: ``""``, ``packed 8 docs``, ``8 docs one by one``, ``pad 0.25``."""
    parts = []
    if documents:
        parts.append(f"{documents} docs one by one" if one_by_one else f"packed {documents} docs")
    if pad_fraction:
        parts.append(f"pad {pad_fraction:g}")
    return ", ".join(parts)
