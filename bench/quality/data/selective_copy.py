"""Synthetic selective copying (Gu and Dao 2023, "Mamba"; docs/quality.md, "Selective copying"); a data token's
``gap`` is its source position minus the previous one's (the first one's from -1): how far its copy looks back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn.validation import invalid, require_int

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


@dataclass(frozen=True)
class Layout:
    """Token id ranges: padding, begin, end, then data ids, then filler ids."""

    num_data: int
    num_fillers: int

    @property
    def data_base(self) -> int:
        return EOS_ID + 1

    @property
    def filler_base(self) -> int:
        return self.data_base + self.num_data

    @property
    def vocab_size(self) -> int:
        return self.filler_base + self.num_fillers


def generate(
    num_examples: int,
    *,
    src_len: int,
    num_tokens: int,
    num_data: int = 16,
    num_fillers: int = 4,
    seed: int,
) -> dict[str, np.ndarray]:
    """``src_ids``, ``tgt_ids`` (begin, data tokens in source order, end), the data tokens' sorted ``positions``
    and ``gap``, and all-True masks of ``num_examples`` examples."""
    require_int("num_examples", num_examples, minimum=0)
    require_int("src_len", src_len, minimum=2)
    require_int("num_data", num_data, minimum=1)
    require_int("num_fillers", num_fillers, minimum=1)
    require_int("num_tokens", num_tokens, minimum=1)
    if num_tokens > num_data:
        raise invalid("num_tokens", f"must be at most num_data={num_data} (the data tokens of a "
                                    f"source are distinct); got {num_tokens}")
    if num_tokens > src_len:
        raise invalid("num_tokens", f"must be at most src_len={src_len} (one source position per "
                                    f"data token); got {num_tokens}")
    layout = Layout(num_data, num_fillers)
    rng = np.random.default_rng(seed)
    n = num_examples
    src = layout.filler_base + rng.integers(0, num_fillers, size=(n, src_len))  # (n, S)
    positions = np.sort(np.argsort(rng.random((n, src_len)), axis=1)[:, :num_tokens], axis=1)
    # distinct data tokens per source: the token written last names one source position
    data = layout.data_base + np.argsort(rng.random((n, num_data)), axis=1)[:, :num_tokens]  # (n, K)
    np.put_along_axis(src, positions, data, axis=1)
    tgt = np.concatenate([np.full((n, 1), BOS_ID), data, np.full((n, 1), EOS_ID)], axis=1)
    gap = np.diff(positions, axis=1, prepend=-1)  # (n, K): the first from position -1
    return {
        "src_ids": src.astype(np.int64),
        "src_mask": np.ones((n, src_len), dtype=bool),
        "tgt_ids": tgt.astype(np.int64),
        "tgt_mask": np.ones((n, num_tokens + 2), dtype=bool),
        "positions": positions.astype(np.int64),
        "gap": gap.astype(np.int64),
    }
