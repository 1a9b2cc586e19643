"""An exact variant's FLOPs are counted where its mask_mod's tensors live.

Seen on an H200: a plug-in whose ``mask_mod`` indexes a buffer (BigBird's table of random
blocks) got ``error`` rows on CUDA ("Expected all tensors to be on the same device"), because
the row's FLOPs were counted from the mask_mod over index grids built on the CPU while the
module, with its buffer, had moved to the GPU. The count now runs on
:func:`attn.devices.module_device`. A CPU process has one real device, so the test moves
the module to ``meta`` and records the device the counting grids are built on.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import attn.cost
from attn import ExactAttention
from attn.cost import CostQuery
from attn.devices import module_device
from attn.mods import dense_allowed


class TableMasked(ExactAttention):
    """Each query block sees the key blocks a buffer lists for it (a mask_mod reading a tensor)."""

    name = "table_masked"

    def __init__(self, block: int = 4, **common) -> None:
        super().__init__(**common)
        self.block = block
        self.register_buffer("table", torch.tensor([0, 0, 1, 0, 3, 2, 1, 3]), persistent=False)

    def mask_mod(self):
        table, block = self.table, self.block

        def allowed(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            qb = (i // block).clamp(max=table.shape[0] - 1)
            return (table[qb] == j // block) | (i // block == j // block)

        return allowed


class _Recorded(Exception):
    pass


def test_module_device_is_where_the_buffers_are() -> None:
    module = TableMasked()
    assert module_device(module) == torch.device("cpu")
    assert module_device(module.to("meta")) == torch.device("meta")
    assert module_device(ExactAttention().to("meta")) == torch.device("cpu")  # holds no tensor


def test_cost_counts_the_mask_on_the_module_device(monkeypatch: pytest.MonkeyPatch) -> None:
    module = TableMasked().to("meta")
    seen: list[torch.device] = []

    def recording(batch: int, heads: int, q_len: int, k_len: int, device: torch.device):
        seen.append(torch.device(device))
        raise _Recorded

    monkeypatch.setattr(attn.cost, "index_grids", recording)
    with pytest.raises(_Recorded):
        module.cost(CostQuery.self_attention(1, 2, 32, 8))
    assert seen == [torch.device("meta")]  # the CPU here is the bug: the buffer is not there


def test_cost_of_a_buffer_mask_counts_its_pairs() -> None:
    module = TableMasked()
    n = 32
    expected = int(dense_allowed(module.mask_mod(), batch=1, heads=1, q_len=n, k_len=n, causal=False,
                                 key_mask=None, device=torch.device("cpu")).sum())
    assert module.cost(CostQuery.self_attention(1, 2, n, 8)).pairs == expected
