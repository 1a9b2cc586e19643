"""The executors (bench/engine/executors) on GPU machines. GPU slots of the local executor map
into the parent's ``CUDA_VISIBLE_DEVICES`` (slot i is the i-th listed device) and never replace
it by a bare index (see docs/gpu.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from bench.engine.executors.base import execute
from bench.engine.executors.local import LocalExecutor, slot_device
from bench.speed import peak as peak_module
from bench.speed import rounds, unit
from bench.speed.config import parse_config
from bench.speed.results import load_results
from bench.speed.rows import measured_row
from bench.speed.sweep import run_sweep


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


# A GPU sweep driven from a head node without a GPU: the device check and the matmul peak are taken on
# the node that runs each unit (through executors.base.execute, as a Ray task does); the driver asks
# CUDA nothing (torch.cuda replaced by recorders; see docs/gpu.md).
GPU = "NVIDIA H100 80GB HBM3"


PEAK = 5e14


class _Cluster:
    """Records who asks CUDA (``head`` or ``node``) and answers as that machine would."""

    def __init__(self, node_has_gpu: bool = True) -> None:
        self.where, self.node_has_gpu = "head", node_has_gpu
        self.asked: list[tuple[str, str]] = []
        self.measured: list[tuple[str, tuple[Any, ...]]] = []

    def is_available(self) -> bool:
        self.asked.append((self.where, "is_available"))
        return self.where == "node" and self.node_has_gpu

    def get_device_name(self, *args: Any) -> str:
        self.asked.append((self.where, "get_device_name"))
        return GPU

    def measure_peak(self, *args: Any) -> float:
        self.measured.append((self.where, args))
        return PEAK


class _RayLike:
    """Not the local executor: each unit runs 'on a node' (the cluster's ``where``)."""

    slots = 1

    def __init__(self, cluster: _Cluster) -> None:
        self.cluster, self.done = cluster, []

    def submit(self, work: Any) -> None:
        self.cluster.where = "node"
        try:
            self.done.append((work, execute(work, None)))
        finally:
            self.cluster.where = "head"

    def wait_any(self) -> tuple[Any, list[dict[str, Any]]]:
        return self.done.pop(0)

    def shutdown(self) -> None:
        pass


def _fake_rounds(runs: tuple, unit_id: str, cuda_visible: str | None = None) -> list[dict]:
    built = {"flops": {"fwd": 1e12}, "flops_kind": "useful", "density": 1.0, "threads": 1}
    prepared = {"first_call_ms": 1.0, "estimate_ms": 1.0, "peak_mem_bytes": 1,
                "rss_peak_bytes": None}
    return [measured_row(r.case, p, built, prepared, {"kernel": r.case.kernel}, [0.01] * 3,
                         unit_id, len(runs)) for r in runs for p in r.passes]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> _Cluster:
    fake = _Cluster()
    monkeypatch.setattr(torch.cuda, "is_available", fake.is_available)
    monkeypatch.setattr(torch.cuda, "get_device_name", fake.get_device_name)
    monkeypatch.setattr(rounds, "measure_peak", fake.measure_peak)
    monkeypatch.setattr(unit, "run_rounds", _fake_rounds)
    monkeypatch.setattr(peak_module, "_MEASURED", {})
    return fake


def _config() -> Any:
    return parse_config({"name": "gpu-from-cpu-head", "device": "cuda", "dtype": "bfloat16",
                         "passes": ["fwd"], "seq_len": [1024, 2048],
                         "variants": [{"name": "full", "kernels": ["reference", "sdpa"]}]})


def test_a_cpu_head_drives_a_gpu_sweep_and_asks_cuda_nothing(cluster, tmp_path):
    run_sweep(_config(), tmp_path, executor=_RayLike(cluster))
    assert not [what for where, what in cluster.asked if where == "head"]
    assert ("node", "is_available") in cluster.asked  # the node checked its device
    df = load_results(tmp_path)
    assert (df.status == "ok").all(), df.reason.tolist()
    assert set(df.device_name) == {GPU}
    # the node's peaks, each measured once on the node, divide every row: bfloat16's for
    # sdpa, float32's for the reference kernel (it computes bfloat16 inputs in float32)
    assert [where for where, _ in cluster.measured] == ["node", "node"]
    assert df.peak_fraction.tolist() == pytest.approx((df.tflops * 1e12 / PEAK).tolist())
    assert json.loads((tmp_path / "peak.json").read_text()) == {
        f"{GPU}/bfloat16/default/matmuldefault": PEAK, f"{GPU}/float32/default/matmuldefault": PEAK}
    assert "_peak_key" not in df.columns


def test_a_resume_passes_the_recorded_peak_to_the_nodes(cluster, tmp_path):
    config = _config()
    run_sweep(config, tmp_path, executor=_RayLike(cluster))
    (tmp_path / "results.csv").write_text(
        (tmp_path / "results.csv").read_text().splitlines()[0] + "\n")  # keep the header only
    peak_module._MEASURED.clear()  # a fresh node process
    run_sweep(config, tmp_path, executor=_RayLike(cluster), allow_mixed=True)
    assert len(cluster.measured) == 2  # the second run read the driver's peak.json


def test_a_node_without_the_device_gives_error_rows_not_a_head_refusal(cluster, tmp_path):
    cluster.node_has_gpu = False
    run_sweep(_config(), tmp_path, executor=_RayLike(cluster))
    df = load_results(tmp_path)
    assert (df.status == "error").all()
    assert df.reason.str.contains("cuda is not available").all()
    assert not cluster.measured
