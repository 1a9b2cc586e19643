"""The harness's measurements are right: memory, FLOPs, time, peak fraction; failures become rows.

One real sweep (worker processes and all) over test-only variants from ``bench.testing``
with known cost, plus reference full attention whose score matrix has a known size.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from attn import create_attention
from bench.config import parse_config
from bench.flops import allowed_pairs, band_pairs, case_flops, counted_pairs
from bench.results import load_results
from bench.sweep import run_sweep

ALLOC = 200 * 2**20
RSS_PRECISION = 2**20
SLEEP = 0.15
N_REF, H_REF = 1024, 2
TEST_VARIANTS = ("bench_sleep", "bench_alloc", "bench_crash", "bench_wrong")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One sweep: known-size / known-time cases, reference attention, OOM, crash, timeout, ok."""
    from attn.registry import unregister_attention

    raw = {
        "name": "measure", "passes": ["fwd", "fwd_bwd"], "seq_len": [64], "heads": H_REF,
        "head_dim": 16, "repeats": 3, "timeout_s": 5, "max_memory_gb": 3, "peak_matmul_size": 1024,
        "plugins": ["bench.testing"],
        "variants": [
            {"name": "bench_alloc", "nbytes": ALLOC},
            {"name": "bench_sleep", "seconds": SLEEP},
            {"name": "full", "kernels": ["reference"], "seq_len": [N_REF]},
            # over the 3 GiB cap: oom at N=64, then N=128 is skipped without running
            {"name": "bench_alloc", "nbytes": 40 * 2**30, "seq_len": [64, 128]},
            {"name": "bench_crash", "how": "abort"},
            {"name": "bench_crash", "how": "kill"},
            {"name": "bench_sleep", "seconds": 60},  # over timeout_s: timeout
            {"name": "bench_sleep", "seconds": 0.01},  # still runs after all that
        ],
    }
    try:
        config = parse_config(raw)
        out = tmp_path_factory.mktemp("measure")
        run_sweep(config, out)
    finally:  # keep test-only variants out of other tests' registry
        for name in TEST_VARIANTS:
            unregister_attention(name)
        sys.modules.pop("bench.testing", None)
    df = load_results(out)
    df["nbytes"] = df.params.map(lambda p: json.loads(p).get("nbytes"))
    df["seconds"] = df.params.map(lambda p: json.loads(p).get("seconds"))
    df["how"] = df.params.map(lambda p: json.loads(p).get("how"))
    return out, df


def test_one_row_per_case_and_pass(run):
    _, df = run
    assert len(df) == 9 * 2
    assert not df.duplicated(["case_id", "pass"]).any()


def test_peak_memory_of_a_known_size_tensor(run):
    _, df = run
    rows = df[(df.variant == "bench_alloc") & (df.nbytes == ALLOC)]
    assert (rows.status == "ok").all(), rows.reason.tolist()
    for peak in rows.peak_mem_bytes:
        # at least the tensor, up to the kernel's RSS counter precision (per-CPU batched
        # counters: tens of pages), and not wildly more
        assert ALLOC - RSS_PRECISION <= peak <= ALLOC + 64 * 2**20


def test_reference_attention_reports_the_score_matrix(run):
    _, df = run
    row = df[(df.variant == "full") & (df["pass"] == "fwd")].iloc[0]
    assert row.status == "ok" and row.kernel == "reference"
    assert row.peak_mem_bytes >= 1 * H_REF * N_REF * N_REF * 4


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


def test_a_known_sleep_is_timed_within_tolerance(run):
    _, df = run
    rows = df[(df.variant == "bench_sleep") & (df.seconds == SLEEP)]
    assert (rows.status == "ok").all()
    for row in rows.itertuples():
        assert SLEEP * 1e3 <= row.time_ms <= SLEEP * 1e3 * 1.15 + 5
        assert row.time_iqr_ms < 20
        assert row.repeats == 3


def test_failures_become_rows_and_the_sweep_goes_on(run):
    _, df = run
    huge = df[(df.variant == "bench_alloc") & (df.nbytes > ALLOC)]
    oom = huge[huge.seq_len == 64]
    assert (oom.status == "oom").all(), oom.reason.tolist()
    assert oom.reason.str.contains("alloc").all()
    skipped = huge[huge.seq_len == 128]
    assert (skipped.status == "skipped").all()
    assert skipped.reason.str.contains("N=64 already hit oom").all()
    abort = df[df.how == "abort"]
    assert (abort.status == "error").all() and abort.reason.str.contains("SIGABRT").all()
    killed = df[df.how == "kill"]
    assert (killed.status == "oom").all() and killed.reason.str.contains("SIGKILL").all()
    slow = df[(df.variant == "bench_sleep") & (df.seconds == 60)]
    assert (slow.status == "timeout").all()
    assert slow[slow["pass"] == "fwd"].reason.iloc[0] == "timed out after 5 s in pass fwd"
    last = df[(df.variant == "bench_sleep") & (df.seconds == 0.01)]
    assert (last.status == "ok").all()


def test_rows_carry_the_environment(run):
    out, df = run
    env = json.loads((out / "env.json").read_text())
    assert env["torch_version"] == torch.__version__
    assert set(df.torch_version) == {torch.__version__}
    assert df.git_sha.str.len().min() >= 7 and df.timestamp.notna().all()
    assert (df.threads == torch.get_num_threads()).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "params"), [
    ("sliding_window", {"window": 3}), ("sliding_window", {"window": 40}),
    ("dilated", {"window": 2, "dilation": 3}), ("dilated", {"window": 20, "dilation": 2}),
    ("global_tokens", {"num_global": 2, "window": 1}),
    ("global_tokens", {"num_global": 50, "window": 5}),
])
@pytest.mark.parametrize("n", [1, 7, 33, 64])
def test_closed_form_pairs_match_counting_the_mask(name, params, causal, n):
    module = create_attention(name, **params)
    assert band_pairs(module.band(), n, causal) == counted_pairs(module, n, n, causal)


def test_pairs_of_full_and_causal():
    assert allowed_pairs(create_attention("full"), 100, False) == 100 * 100
    assert allowed_pairs(create_attention("full"), 100, True) == 100 * 101 // 2
    assert allowed_pairs(create_attention("causal"), 100, False) == 100 * 101 // 2
    flops, kind, density = case_flops(create_attention("sliding_window", window=1), batch=2,
                                      heads=3, n=10, head_dim=8, causal=False)
    assert flops["fwd"] == 4 * 2 * 3 * (3 * 10 - 2) * 8 and kind == "useful"
    assert flops["bwd"] == 2.5 * flops["fwd"] and density == pytest.approx(28 / 100)
    flops, kind, _ = case_flops(create_attention("nystrom", num_landmarks=4), batch=1, heads=1,
                                n=16, head_dim=2, causal=False)
    assert kind == "nystrom_actual"
    assert flops["fwd"] == (2 * 16 * 4 * 2) * 4 + 2 * 4 * 4 * 2 + 8 * 4**3 * 6 + 2 * 16 * 4 * 4


@pytest.mark.slow
def test_fwd_bwd_memory_counts_the_gradients_of_the_call():
    """fwd_bwd peak includes the call's output and its q, k, v gradients: the previous call's
    gradients are dropped before the baseline is read, not inside the measured call (where
    their freed pages would be reused unseen)."""
    from bench.cases import Case
    from bench.worker import run_case

    n, heads, dim = 16384, 8, 64
    case = Case(variant="sliding_window", label="sliding_window", params=(("window", 128),),
                kernel="blocked", seq_len=n, batch=1, heads=heads, head_dim=dim, dtype="float32",
                device="cpu", causal=False, passes=("fwd_bwd",), repeats=3, warmup=1,
                timeout_s=120, max_memory_gb=None, threads=None, time_budget_s=30, plugins=())
    (row,) = run_case(case)
    assert row["status"] == "ok", row["reason"]
    tensor = heads * n * dim * 4  # one (1, H, N, D) fp32 tensor
    assert row["peak_mem_bytes"] >= 4 * tensor - RSS_PRECISION  # out, dq, dk, dv
