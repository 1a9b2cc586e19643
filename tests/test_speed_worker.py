"""A pass reports its compile times apart from its timed calls: the first backward's extra
time is the backward's compile where a kernel that compiles per shape ran, and 0 elsewhere."""

from __future__ import annotations

import gc
import importlib
import sys
import weakref
from typing import Any

import pytest
import torch
from test_speed_rounds import unit_case

from attn import create_attention
from attn.kernels import get_kernel
from bench.engine.measure import start_autograd
from bench.speed import worker
from bench.speed.cases import Case
from bench.speed.worker import PassRunner

FIRST_BWD_S, BWD_S = 0.3, 0.02


@pytest.fixture
def phases():
    start_autograd()  # as a worker does before its first pass
    sys.modules.pop("bench.engine.testing", None)  # an earlier test may have unregistered its variants
    testing = importlib.import_module("bench.engine.testing")  # a fresh import registers them
    module = create_attention("bench_phases", first_s=0.0, fwd_s=0.0, bwd_s=BWD_S, bwd_nbytes=1,
                              first_bwd_s=FIRST_BWD_S)
    yield module
    testing.unregister_test_variants()


def _case(pass_name: str) -> Case:
    return Case(variant="bench_phases", label="phases", params=(), kernel="auto", seq_len=16, batch=1,
                heads=2, head_dim=8, dtype="float32", device="cpu", causal=False, passes=(pass_name,),
                repeats=3, warmup=1, timeout_s=60, max_memory_gb=None, threads=None, time_budget_s=1,
                plugins=(), min_repeats=3)


@pytest.mark.serial  # reads sleeps of known length
@pytest.mark.parametrize("pass_name", ["bwd", "fwd_bwd"])
def test_the_backward_compile_is_measured_where_a_compiling_kernel_ran(phases, pass_name, monkeypatch):
    monkeypatch.setattr(type(get_kernel("native")), "compiles_per_shape", True)
    runner = PassRunner(_case(pass_name), phases, pass_name)
    info = {**runner.warm(), **runner.prepare()}
    assert FIRST_BWD_S * 1e3 * 0.9 <= info["compile_bwd_ms"] <= FIRST_BWD_S * 1e3 * 1.3
    assert info["first_call_ms"] >= (FIRST_BWD_S + BWD_S) * 1e3
    assert info["estimate_ms"] < (FIRST_BWD_S + BWD_S) * 1e3 / 2  # the estimate call is warm


@pytest.mark.serial
def test_no_compile_is_reported_where_nothing_compiles(phases):
    for pass_name, expected in (("fwd_bwd", 0.0), ("fwd", None)):
        runner = PassRunner(_case(pass_name), phases, pass_name)
        runner.warm()
        assert runner.prepare()["compile_bwd_ms"] == expected


def test_inputs_are_drawn_on_the_case_device(phases):
    runner = PassRunner(_case("fwd_bwd"), phases, "fwd_bwd")
    again = PassRunner(_case("fwd_bwd"), phases, "fwd_bwd")
    assert runner.q.device == torch.device("cpu") and runner.q.requires_grad
    assert torch.equal(runner.q, again.q) and not torch.equal(runner.q, runner.k)  # seeded, distinct


# Between the passes of a CUDA unit the worker releases its module, cached masks and the allocator's
# pool, then builds the module again (torch.cuda replaced by recorders; see docs/gpu.md).
class _Module:
    """Stands in for an attention module holding cached device memory."""


class _Conn:
    def __init__(self, messages: list[tuple[Any, ...]]) -> None:
        self.messages, self.sent = list(messages), []

    def recv(self) -> tuple[Any, ...]:
        return self.messages.pop(0)

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


class _Runner:
    def __init__(self, case: Case, module: Any, pass_name: str) -> None:
        self.module = module

    def warm(self) -> dict[str, Any]:
        return {"first_call_ms": 1.0}

    def prepare(self) -> dict[str, Any]:
        return {"estimate_ms": 1.0}


def test_the_worker_releases_its_module_and_cached_pool_and_rebuilds(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(worker.torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(worker.torch.cuda, "memory_reserved", lambda *a: 0)
    first = [_Module()]
    gone = weakref.ref(first[0])
    alive_at_rebuild: list[bool] = []

    def build(case: Case) -> tuple[_Module, dict[str, Any]]:
        gc.collect()
        alive_at_rebuild.append(gone() is not None)
        return _Module(), {}

    monkeypatch.setattr(worker, "_build", build)
    monkeypatch.setattr(worker, "_runner", _Runner)
    conn = _Conn([("warm", "fwd"), ("prepare", "fwd"), ("release",), ("warm", "bwd"), ("prepare", "bwd"),
                  ("exit",)])
    worker._serve(unit_case("reference", "cuda"), first.pop(), conn)  # the worker's only reference
    assert [m[0] for m in conn.sent] == ["warmed", "prepared", "released", "warmed", "prepared"]
    assert conn.sent[2] == ("released", 0)
    assert "empty_cache" in calls
    assert alive_at_rebuild == [False]  # released (cached masks with it), then built again
