"""Torch's thread count for a scope, lest it leak into whatever the process runs next (reductions round otherwise)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """Run the block with ``threads`` intra-op threads (``None``: unchanged); yield the count."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
