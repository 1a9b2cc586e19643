"""A score term reaches only kernels that can run it: SDPA and the blocked core add a bias
evaluated on zero scores, so they take a score_mod only where it is an additive bias
(ALiBi, a learned table: declared; a plug-in's bias: proven on two scores) and refuse
soft-capping, which ``auto`` then runs on a kernel that applies it to the real scores."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from attn import ExactAttention, create_attention, register_attention
from attn.conformance import check_attention
from attn.kernels import kernels_for
from attn.kernels.reference import dense_attention
from attn.pattern import Pattern
from attn.registry import unregister_attention
from attn.validation import Param


def generate_tanh_softcap(soft_cap: float):
    """attention-gym's soft-capping score_mod (Gemma 2), as written there."""
    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return soft_cap * torch.tanh(score / soft_cap)
    return tanh_softcap


def generate_sliding_window(window_size: int):
    """attention-gym's sliding window mask_mod, as written there."""
    def sliding_window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= window_size
    return sliding_window


class SoftCapWindow(ExactAttention):
    """A causal-friendly sliding window with Gemma 2's tanh soft-capping of the scores."""

    example_params = ({"soft_cap": 2.0, "window": 3},)
    param_rules: ClassVar[dict[str, Param]] = {"window": Param(minimum=0)}

    def __init__(self, soft_cap: float = 20.0, window: int = 64, **common):
        self.check_params(window=window)
        if not soft_cap > 0:
            raise ValueError(f"soft_cap: must be a number > 0; got {soft_cap!r}")
        super().__init__(**common)
        self.soft_cap, self.window = soft_cap, window

    def mask_mod(self):
        return generate_sliding_window(self.window)

    def score_mod(self):
        return generate_tanh_softcap(self.soft_cap)


class DistanceBias(SoftCapWindow):
    """The same window with an undeclared additive bias (a plug-in's ALiBi-like term)."""

    def score_mod(self):
        return lambda score, b, h, i, j: score - 0.25 * (i - j).abs()


@pytest.fixture
def plugins():
    register_attention("softcap_window", overwrite=True)(SoftCapWindow)
    register_attention("distance_bias", overwrite=True)(DistanceBias)
    yield
    unregister_attention("softcap_window")
    unregister_attention("distance_bias")


def test_soft_capping_is_refused_by_kernels_that_add_a_bias_and_runs_on_the_others(plugins):
    att = create_attention("softcap_window", soft_cap=2.0, window=5)
    q, k, v = (torch.randn(2, 3, 40, 8, dtype=torch.float64) * 3 for _ in range(3))
    kernels = kernels_for(att.pattern())
    assert "sdpa" not in kernels and "blocked" not in kernels
    assert {"chunked", "reference"} <= set(kernels)
    expected = dense_attention(q, k, v, mask_mod=att.mask_mod(), score_mod=att.score_mod(), causal=True)
    torch.testing.assert_close(att(q, k, v, causal=True), expected)
    assert att.last_path.kernel != "sdpa"
    with pytest.raises(ValueError, match=r"'kernel': unknown value 'sdpa'; allowed values are \['auto', "
                                         r"'reference', 'chunked', 'flex'\]"):
        create_attention("softcap_window", soft_cap=2.0, window=5, kernel="sdpa")


@pytest.mark.parametrize(("name", "params"), [
    ("relative", {"bias": "alibi", "num_heads": 3}),
    ("relative", {"bias": "learned", "num_heads": 3, "max_distance": 4}),
    ("distance_bias", {"soft_cap": 2.0, "window": 5}),
])
def test_an_additive_bias_still_reaches_sdpa(plugins, name, params):
    att = create_attention(name, **params)
    assert "sdpa" in kernels_for(att.pattern())
    q, k, v = (torch.randn(1, 3, 24, 8, dtype=torch.float64) for _ in range(3))
    reference = create_attention(name, **params, kernel="reference")
    reference.load_state_dict(att.state_dict())
    sdpa = create_attention(name, **params, kernel="sdpa")
    sdpa.load_state_dict(att.state_dict())
    torch.testing.assert_close(sdpa(q, k, v, causal=True), reference(q, k, v, causal=True))


def test_the_kit_passes_soft_capping_on_the_kernels_that_run_it(plugins):
    report = check_attention("softcap_window", kernels=["reference", "chunked"], isolate=False)
    assert report.passed, "\n".join(report.failures)
    assert {r.kernel for r in report.results if r.status == "pass"} >= {"reference", "chunked"}


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_the_kit_passes_soft_capping_on_compiled_flex(plugins):
    # the quick profile, as the registered variants' flex rows run it: every check, each
    # causal x key_mask combination once (the full profile compiles flex per shape: 240 s)
    report = check_attention("softcap_window", kernels=["flex"], isolate=False, quick=True)
    assert report.passed, "\n".join(report.failures)


def test_kernels_for_reads_the_proof():
    capped = Pattern("capped", score_mod=generate_tanh_softcap(5.0))
    biased = Pattern("biased", score_mod=lambda s, b, h, i, j: s + (j - i) * 0.5)
    assert not capped.score_is_bias and biased.score_is_bias
    assert "sdpa" not in kernels_for(capped) and "sdpa" in kernels_for(biased)
