"""The harness's measurements are right: memory, time, peak fraction; failures become rows.

One real sweep (worker processes and all) over test-only variants from ``bench.engine.testing``
with known cost, plus reference full attention whose score matrix has a known size; its tests
are ``serial`` (no other test runs beside the sweep that times and measures). A second sweep
with a short timeout holds the case that outlives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.runner import load_run
from bench.speed.cases import Case
from bench.speed.results import load_results
from bench.speed.sweep import run_sweep
from bench.speed.unit import run_case

MiB = 2**20
ALLOC = 200 * MiB
FRAGMENT_MIB = 24
SLEEP = 0.15
N_REF, H_REF = 1024, 2


def _sweep(raw: dict, out: Path) -> pd.DataFrame:
    """Run the sweep ``raw`` into ``out``; its rows, with their parameters as columns."""
    from bench.engine.testing import unregister_test_variants

    try:
        run_sweep(load_run(raw), out)
    finally:  # keep test-only variants out of other tests' registry
        unregister_test_variants()
    df = load_results(out)
    for key in ("nbytes", "seconds", "how", "mib"):
        df[key] = df.params.map(lambda p, key=key: json.loads(p).get(key))
    return df


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One sweep: known-size / known-time cases, reference attention, OOM, crashes."""
    raw = {
        "name": "measure", "passes": ["fwd", "fwd_bwd"], "seq_len": [64], "heads": H_REF,
        "head_dim": 16, "repeats": 3, "min_repeats": 3, "timeout_s": 10, "max_memory_gb": 3,
        "peak_matmul_size": 1024, "plugins": ["bench.engine.testing"],
        "variants": [
            {"name": "bench_alloc", "nbytes": ALLOC},
            {"name": "bench_fragment", "mib": FRAGMENT_MIB},
            {"name": "bench_sleep", "seconds": SLEEP},
            {"name": "full", "kernels": ["reference"], "seq_len": [N_REF]},
            # over the 3 GiB cap: oom at N=64, then N=128 is skipped without running
            {"name": "bench_alloc", "nbytes": 40 * 2**30, "seq_len": [64, 128]},
            {"name": "bench_crash", "how": "abort"},
            {"name": "bench_crash", "how": "kill"},
            {"name": "bench_crash", "how": "rt"},
            {"name": "bench_sleep", "seconds": 0.01},  # still runs after all that
        ],
    }
    out = tmp_path_factory.mktemp("measure")
    return out, _sweep(raw, out)


#: the timeout of the sweep that times out: short, as all it waits on is a case sleeping past
#: it (in each pass); long enough for a worker to build its case (a fork of the forkserver)
TIMEOUT_S = 3


@pytest.fixture
def timed_out(tmp_path):
    """A sweep of one case that sleeps far past the timeout, in both passes."""
    raw = {
        "name": "timeout", "passes": ["fwd", "fwd_bwd"], "seq_len": [64], "heads": 1, "head_dim": 16,
        "repeats": 3, "min_repeats": 3, "timeout_s": TIMEOUT_S, "peak_matmul_size": 128,
        "plugins": ["bench.engine.testing"], "variants": [{"name": "bench_sleep", "seconds": 60}],
    }
    return _sweep(raw, tmp_path)


@pytest.mark.serial
def test_one_row_per_case_and_pass(run):
    _, df = run
    assert len(df) == 10 * 2
    assert not df.duplicated(["case_id", "pass"]).any()


@pytest.mark.serial
def test_peak_memory_of_a_known_size_tensor(run):
    _, df = run
    rows = df[(df.variant == "bench_alloc") & (df.nbytes == ALLOC)]
    assert (rows.status == "ok").all(), rows.reason.tolist()
    for row in rows.itertuples():
        # the live tensor peak is the tensor (plus the small output), to the byte
        assert ALLOC <= row.peak_mem_bytes <= ALLOC + MiB
        assert row.rss_peak_bytes >= ALLOC - MiB  # the OS saw it too (1 MiB counter precision)


@pytest.mark.serial
def test_freed_blocks_kept_by_the_c_library_are_not_the_calls_memory(run):
    """A call that frees a heap temporary and then maps a larger block: its live peak is the
    other temporary and the block, while the resident peak also holds the freed block glibc
    keeps."""
    from bench.engine.testing import FragmentAttention  # already imported by the fixture

    _, df = run
    rows = df[df.variant == "bench_fragment"]
    assert (rows.status == "ok").all(), rows.reason.tolist()
    live = (FRAGMENT_MIB + FragmentAttention.mapped_mib(FRAGMENT_MIB)) * MiB
    for row in rows.itertuples():
        assert live <= row.peak_mem_bytes <= live + MiB
        assert row.rss_peak_bytes >= live + (FRAGMENT_MIB - 2) * MiB


@pytest.mark.serial
def test_reference_attention_reports_the_score_matrix(run):
    _, df = run
    row = df[(df.variant == "full") & (df["pass"] == "fwd")].iloc[0]
    assert row.status == "ok" and row.kernel == "reference"
    scores = H_REF * N_REF * N_REF * 4
    assert scores <= row.peak_mem_bytes <= 3 * scores  # scores, probabilities


@pytest.mark.serial
def test_flops_follow_the_formula_and_peak_fraction(run):
    out, df = run
    rows = df[df.variant == "full"].set_index("pass")
    fwd = 4 * 1 * H_REF * N_REF * N_REF * 16
    assert rows.loc["fwd", "flops"] == fwd
    assert rows.loc["fwd_bwd", "flops"] == 3.5 * fwd
    assert rows.loc["fwd", "flops_kind"] == "useful"
    tflops = fwd / (rows.loc["fwd", "time_ms"] / 1e3) / 1e12
    assert rows.loc["fwd", "tflops"] == pytest.approx(tflops, rel=1e-6)
    peak = next(iter(json.loads((out / "peak.json").read_text()).values()))
    assert peak > 1e9  # a matmul on any CPU does more than 1 GFLOP/s
    assert rows.loc["fwd", "peak_fraction"] == pytest.approx(tflops * 1e12 / peak, rel=1e-6)


@pytest.mark.serial
def test_a_known_sleep_is_timed_within_tolerance(run):
    _, df = run
    rows = df[(df.variant == "bench_sleep") & (df.seconds == SLEEP)]
    assert (rows.status == "ok").all()
    for row in rows.itertuples():
        times = json.loads(row.times_ms)
        assert len(times) == row.repeats == 3
        assert all(SLEEP * 1e3 <= t <= SLEEP * 1e3 * 1.15 + 5 for t in times)
        assert row.time_ms == pytest.approx(sorted(times)[1], rel=1e-5)
        assert row.estimate_ms >= SLEEP * 1e3 and row.first_call_ms >= SLEEP * 1e3


@pytest.mark.serial
def test_failures_become_rows_and_the_sweep_goes_on(run):
    _, df = run
    huge = df[(df.variant == "bench_alloc") & (df.nbytes > ALLOC)]
    oom = huge[huge.seq_len == 64]
    assert (oom.status == "oom").all(), oom.reason.tolist()
    assert oom.reason.str.contains("address-space cap").all()
    skipped = huge[huge.seq_len == 128]
    assert (skipped.status == "skipped").all()
    assert skipped.reason.str.contains("N=64 already hit oom").all()
    abort = df[df.how == "abort"]
    assert (abort.status == "error").all() and abort.reason.str.contains("SIGABRT").all()
    killed = df[df.how == "kill"]
    assert (killed.status == "killed").all() and killed.reason.str.contains("SIGKILL").all()
    realtime = df[df.how == "rt"]
    assert (realtime.status == "error").all() and realtime.reason.str.contains("SIGRTMIN+6", regex=False).all()
    last = df[(df.variant == "bench_sleep") & (df.seconds == 0.01)]
    assert (last.status == "ok").all()


def test_a_case_past_the_timeout_becomes_a_timeout_row_in_each_pass(timed_out):
    assert len(timed_out) == 2 and (timed_out.status == "timeout").all()
    reasons = timed_out.set_index("pass").reason
    assert reasons["fwd"] == f"timed out after {TIMEOUT_S} s in pass fwd"
    # the timeout is per pass: the second pass ran (and timed out) on its own
    assert reasons["fwd_bwd"] == f"timed out after {TIMEOUT_S} s in pass fwd_bwd"


@pytest.mark.serial
def test_rows_carry_the_environment(run):
    out, df = run
    (env,) = json.loads((out / "env.json").read_text())["segments"]
    assert env["torch_version"] == torch.__version__
    assert set(df.torch_version) == {torch.__version__}
    assert set(df.git_sha) == {env["git_sha"]} and set(df.hostname) == {env["hostname"]}
    assert df.timestamp.notna().all() and set(df.package_version) == {env["package_version"]}
    assert (df.threads == torch.get_num_threads()).all()


@pytest.mark.slow
def test_fwd_bwd_memory_counts_the_gradients_of_the_call():
    """fwd_bwd peak includes the call's output and its q, k, v gradients: the previous call's
    gradients are dropped before the baseline, not inside the measured call."""
    from bench.speed.cases import Case
    from bench.speed.unit import run_case

    n, heads, dim = 16384, 8, 64
    case = Case(variant="sliding_window", label="sliding_window", params=(("window", 128),),
                kernel="blocked", seq_len=n, batch=1, heads=heads, head_dim=dim, dtype="float32",
                device="cpu", causal=False, passes=("fwd_bwd",), repeats=3, warmup=1,
                timeout_s=120, max_memory_gb=None, threads=None, time_budget_s=30, plugins=(),
                min_repeats=3)
    (row,) = run_case(case)
    assert row["status"] == "ok", row["reason"]
    tensor = heads * n * dim * 4  # one (1, H, N, D) fp32 tensor
    assert row["peak_mem_bytes"] >= 4 * tensor  # out, dq, dk, dv


def _allocate_and_keep(box: list) -> None:
    box.append(torch.ones(4 * MiB // 4))  # 4 MiB of float32, alive after the call


def test_a_peak_reading_that_runs_out_of_memory_is_read_again_or_left_empty(monkeypatch):
    """The legacy recorder running out of memory is a failed reading, not a failed call: the
    kineto profiler reads the same peak; when it fails too, the peak is None; any other
    error is the call's and propagates."""
    import bench.engine.measure as measure

    def oom(call):
        raise MemoryError("std::bad_alloc")

    box: list = []
    expected = measure.tensor_peak_bytes_cpu(lambda: _allocate_and_keep(box))
    assert expected >= 4 * MiB
    monkeypatch.setattr(measure, "_allocation_events", oom)
    assert measure.tensor_peak_bytes_cpu(lambda: _allocate_and_keep(box)) == expected
    monkeypatch.setattr(measure, "_kineto_allocation_events", oom)
    assert measure.tensor_peak_bytes_cpu(lambda: _allocate_and_keep(box)) is None

    def broken(call):
        raise ValueError("not a memory problem")

    monkeypatch.setattr(measure, "_allocation_events", broken)
    with pytest.raises(ValueError, match="not a memory problem"):
        measure.tensor_peak_bytes_cpu(lambda: _allocate_and_keep(box))


def test_a_long_call_is_read_with_kineto_from_the_start(monkeypatch):
    """A call known to take KINETO_FROM_S or more never meets the legacy recorder."""
    import bench.engine.measure as measure

    def legacy(call):
        raise AssertionError("the legacy recorder read a long call")

    box: list = []
    monkeypatch.setattr(measure, "_allocation_events", legacy)
    assert measure.tensor_peak_bytes_cpu(lambda: _allocate_and_keep(box), call_s=measure.KINETO_FROM_S) >= 4 * MiB


# The harness measures what it says, pass by pass, and agrees with an independent reading (a thread
# polling the resident size of a plain script); every test here times or measures: `serial`.
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
