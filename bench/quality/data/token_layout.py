"""The token id ranges of the synthetic recall tasks: reserved ids, then keys, values and fillers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLayout:
    """Token id ranges (``*_base``: the id of item 0) after ``reserved`` ids (padding, markers)."""

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
