"""The harness measures what it says, pass by pass, and agrees with an independent reading.

Known-structure cases catch the plausible bugs of a timer: the warm-up or the untimed setup
counted in the time, the forward counted in the backward, a unit error, memory of the
inputs or of another pass counted. The independent reading (a thread polling the resident
size of a plain script) checks the resident-memory column of a real kernel, and that the
tensor-level peak is the score matrices it must allocate. Every test here times or measures:
``serial``, no other test runs beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.speed.cases import Case
from bench.speed.unit import run_case

MiB = 2**20
FIRST_S, FWD_S, BWD_S, BWD_BYTES = 0.4, 0.05, 0.08, 48 * MiB


def _case(variant: str, params: tuple, passes: tuple[str, ...], **extra) -> Case:
    base = dict(variant=variant, label=variant, params=params, kernel="auto", seq_len=64, batch=1,
                heads=2, head_dim=16, dtype="float32", device="cpu", causal=False, passes=passes,
                repeats=5, warmup=1, timeout_s=60, max_memory_gb=None, threads=None,
                time_budget_s=10, plugins=("bench.engine.testing",), min_repeats=5)
    return Case(**{**base, **extra})


@pytest.fixture(scope="module")
def phases():
    from bench.engine.testing import unregister_test_variants

    params = (("bwd_nbytes", BWD_BYTES), ("bwd_s", BWD_S), ("first_s", FIRST_S), ("fwd_s", FWD_S))
    try:
        rows = run_case(_case("bench_phases", params, ("fwd", "bwd", "fwd_bwd")))
    finally:
        unregister_test_variants()
    return {row["pass"]: row for row in rows}


def _within(value_ms: float, expected_s: float) -> bool:
    return expected_s * 1e3 <= value_ms <= expected_s * 1e3 * 1.15 + 5


@pytest.mark.serial
def test_each_pass_times_only_its_own_work(phases):
    assert all(row["status"] == "ok" for row in phases.values()), phases
    # the backward alone, not the forward run before it; both together in fwd_bwd
    expected = {"fwd": FWD_S, "bwd": BWD_S, "fwd_bwd": FWD_S + BWD_S}
    for pass_name, seconds in expected.items():
        row = phases[pass_name]
        times = json.loads(row["times_ms"])
        assert row["repeats"] == len(times) == 5
        assert all(_within(t, seconds) for t in times), (pass_name, times)
        assert _within(row["time_ms"], seconds)


@pytest.mark.serial
def test_the_first_call_is_reported_apart_and_never_timed(phases):
    fwd = phases["fwd"]
    # at least the slow first call (a fresh process may add its own first-use costs)
    assert (FIRST_S + FWD_S) * 1e3 <= fwd["first_call_ms"] <= (FIRST_S + FWD_S) * 2e3
    assert max(json.loads(fwd["times_ms"])) < (FIRST_S + FWD_S) * 1e3 / 2
    assert _within(fwd["estimate_ms"], FWD_S)  # the call that set the repeats


@pytest.mark.serial
def test_memory_is_the_passs_own(phases):
    assert phases["fwd"]["peak_mem_bytes"] < MiB  # the backward's temporary is not the forward's
    assert BWD_BYTES <= phases["bwd"]["peak_mem_bytes"] <= BWD_BYTES + 2 * MiB
    assert BWD_BYTES <= phases["fwd_bwd"]["peak_mem_bytes"] <= BWD_BYTES + 2 * MiB


N, HEADS, DIM = 2048, 8, 64
PLAIN = f"""
import json, threading, time, torch
from attn import create_attention
module = create_attention("full", kernel="reference")
q, k, v = (torch.randn(1, {HEADS}, {N}, {DIM}) for _ in range(3))
rss = lambda: int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
with torch.no_grad():
    module(q, k, v)  # warm-up call, as the harness makes
    before, samples, running = rss(), [], True
    def sample():  # an independent reading: poll the resident size during the call
        while running:
            samples.append(rss())
            time.sleep(0.0005)
    sampler = threading.Thread(target=sample)
    sampler.start()
    module(q, k, v)
    running = False
    sampler.join()
print(json.dumps({{"peak": max(samples) - before}}))
"""


@pytest.mark.slow
@pytest.mark.serial  # the independent reading polls every 0.5 ms: a busy neighbour starves it
def test_resident_memory_agrees_with_an_independent_reading():
    case = _case("full", (), ("fwd",), kernel="reference", seq_len=N, heads=HEADS, head_dim=DIM,
                 plugins=())
    plain = json.loads(subprocess.run([sys.executable, "-c", PLAIN], capture_output=True,
                                      text=True, check=True).stdout)
    (row,) = run_case(case)
    assert row["status"] == "ok", row["reason"]
    scores = HEADS * N * N * 4  # one (1, H, N, N) fp32 matrix
    assert row["rss_peak_bytes"] == pytest.approx(plain["peak"], rel=0.1)
    # the live tensors hold at least the scores and their softmax, and the OS saw them
    assert 2 * scores <= row["peak_mem_bytes"] <= row["rss_peak_bytes"] + MiB
