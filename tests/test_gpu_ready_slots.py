"""GPU slots of the local executor map into the parent's ``CUDA_VISIBLE_DEVICES`` (slot i is
the i-th listed device) and never replace it by a bare index (see docs/gpu.md)."""

from __future__ import annotations

import pytest

from bench.engine.executors.local import LocalExecutor, slot_device


def test_a_slot_is_the_ith_device_the_parent_lists():
    assert slot_device(0, "3,5") == "3"
    assert slot_device(1, "3,5") == "5"
    assert slot_device(1, " GPU-aa , GPU-bb ") == "GPU-bb"  # UUIDs, spaces


def test_without_a_parent_list_a_slot_is_its_index():
    assert slot_device(1, None) == "1"
    assert slot_device(2, "") == "2"


def test_a_slot_beyond_the_parent_list_is_refused():
    with pytest.raises(ValueError, match="slot 2 .*'3,5' lists 2"):
        slot_device(2, "3,5")


def test_the_executor_gives_slot_workers_the_parents_devices(monkeypatch):
    executor = LocalExecutor("cuda", gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert [executor._cuda_visible(s) for s in (0, 1)] == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [executor._cuda_visible(s) for s in (0, 1)] == ["0", "1"]
    assert LocalExecutor("cuda", gpus=1)._cuda_visible(0) is None  # one GPU: inherit as is
    assert LocalExecutor("cpu")._cuda_visible(0) is None
