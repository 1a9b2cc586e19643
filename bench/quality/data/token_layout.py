"""The token id ranges shared by the synthetic recall tasks: reserved ids, then keys, values
and fillers, each range contiguous."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLayout:
    """Token id ranges for given vocabulary sizes (``*_base`` is the id of item 0); the first
    ``reserved`` ids (padding, markers) precede the keys."""

    num_keys: int
    num_values: int
    num_fillers: int
    reserved: int

    @property
    def key_base(self) -> int:
        return self.reserved

    @property
    def value_base(self) -> int:
        return self.key_base + self.num_keys

    @property
    def filler_base(self) -> int:
        return self.value_base + self.num_values

    @property
    def vocab_size(self) -> int:
        return self.filler_base + self.num_fillers
