"""A pass reports its compile times apart from its timed calls: the first backward's extra
time is the backward's compile where a kernel that compiles per shape ran, and 0 elsewhere."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from attn import create_attention
from attn.kernels import get_kernel
from bench.engine.measure import start_autograd
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
