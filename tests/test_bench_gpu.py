"""The CUDA measuring path (events, L2 flush, max_memory_allocated); skipped without a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from bench.speed.config import parse_config
from bench.speed.results import load_results
from bench.speed.sweep import run_sweep

pytestmark = pytest.mark.gpu


def test_cuda_reference_attention_memory_and_flops(tmp_path):
    n, heads, dim = 4096, 4, 64
    config = parse_config({
        "name": "gpu", "device": "cuda", "dtype": "float32", "passes": ["fwd", "fwd_bwd"],
        "seq_len": [n], "heads": heads, "head_dim": dim, "repeats": 5,
        "variants": [{"name": "full", "kernels": ["reference", "sdpa"]}],
    })
    run_sweep(config, tmp_path)
    df = load_results(tmp_path)
    assert (df.status == "ok").all(), df.reason.tolist()
    ref = df[(df.kernel == "reference") & (df["pass"] == "fwd")].iloc[0]
    assert ref.peak_mem_bytes >= heads * n * n * 4  # the score matrix, allocated on the GPU
    assert ref.flops == 4 * heads * n * n * dim
    sdpa = df[(df.kernel == "sdpa") & (df["pass"] == "fwd")].iloc[0]
    assert sdpa.peak_mem_bytes < heads * n * n * 4  # fused: no score matrix
    peak = next(iter(json.loads((tmp_path / "peak.json").read_text()).values()))
    for row in (ref, sdpa):  # the fraction is the row's own FLOP/s over the same-run matmul peak
        assert row.peak_fraction == pytest.approx(row.flops / (row.time_ms / 1e3) / peak, rel=1e-6)
    assert sdpa.tflops > ref.tflops  # the fused kernel beats the materialised scores
    assert torch.cuda.get_device_name() in set(df.device_name)
