"""Torch's intra-op thread count, set for a scope and restored after it.

In-process entry points (training, the decoding benchmark) take a ``threads`` argument; setting
it with ``torch.set_num_threads`` alone would leak into whatever the process runs next (another
run, the rest of a test session), and float reductions split over a different number of
threads round differently. :func:`torch_threads` keeps the change inside its ``with`` block.
"""

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
