"""The ``model_step`` workload: a whole encoder_classifier training step per variant, measured
by the same harness, with its FLOPs and a config that says what it needs."""

from __future__ import annotations

import pytest

from bench.engine.config import ConfigError
from bench.runner import load_run
from bench.speed.cases import Case, expand_cases
from bench.speed.config import parse_config
from bench.speed.model_step import model_flops
from bench.speed.results import load_results
from bench.speed.sweep import run_sweep

MODEL = {"d_model": 32, "num_heads": 2, "num_layers": 2, "d_ff": 64}
BASE = {"name": "m", "workload": "model_step", "model": MODEL, "seq_len": [64, 128],
        "repeats": 3, "min_repeats": 3, "time_budget_s": 0.5, "timeout_s": 60,
        "peak_matmul_size": 256, "variants": [{"name": "full"}, {"name": "nystrom",
                                                                   "num_landmarks": 8}]}


@pytest.mark.parametrize(("change", "fragment"), [
    ({"model": None}, "'model': a model_step sweep needs model settings"),
    ({"model": {"d_model": 30, "num_heads": 4, "num_layers": 1}}, "'model.d_model': must be divisible"),
    ({"model": {**MODEL, "depth": 3}}, "'model.depth': unknown model setting"),
    ({"passes": ["bwd"]}, "'passes': unknown value 'bwd'"),
    ({"workload": "inference"}, "'workload': unknown value 'inference'"),
])
def test_bad_model_step_configs_name_the_key(change, fragment):
    raw = {**BASE, **change}
    if change.get("model", 1) is None:
        raw.pop("model")
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        parse_config(raw)


def test_an_attention_sweep_refuses_model_settings():
    with pytest.raises(ConfigError, match="only a 'workload: model_step' sweep takes model"):
        parse_config({**BASE, "workload": "attention"})


def test_cases_take_the_models_heads_and_their_own_ids():
    cases = expand_cases(parse_config(BASE))
    assert {(c.heads, c.head_dim) for c in cases} == {(2, 16)}
    assert set(cases[0].passes) == {"fwd", "train_step"}
    attention_case = Case(**{**cases[0].to_dict(), "workload": "attention", "model": ()})
    assert attention_case.case_id != cases[0].case_id


def test_model_flops_add_the_dense_layers_to_the_attention_cost():
    from attn import create_attention

    (case,) = [c for c in expand_cases(parse_config(BASE)) if c.variant == "full" and c.seq_len == 64]
    flops, kind, density = model_flops(case, create_attention("full"))
    tokens, layers, d, d_ff = 64, 2, 32, 64
    dense = 2 * (4 * d * d + 2 * d * d_ff) * tokens * layers
    attention = 4 * 2 * 64 * 64 * 16  # B * H * N^2 pairs, 4 * D per pair
    assert flops["fwd"] == dense + layers * attention
    assert flops["train_step"] == 3 * dense + layers * round(3.5 * attention)
    assert kind == "model_step (attention useful)" and density == 1.0


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_model_step_sweep_measures_every_variant(tmp_path):
    run_sweep(parse_config(BASE), tmp_path)
    df = load_results(tmp_path)
    assert (df.status == "ok").all(), df.reason.tolist()
    assert set(df["pass"]) == {"fwd", "train_step"} and len(df) == 2 * 2 * 2
    step = df[df["pass"] == "train_step"]
    fwd = df[df["pass"] == "fwd"].set_index(["variant", "seq_len"])
    for row in step.itertuples():  # a step holds activations, gradients and the update
        assert row.peak_mem_bytes > fwd.loc[(row.variant, row.seq_len), "peak_mem_bytes"]
    assert step.kernel_path.str.contains("nystrom").any()


def test_the_model_cpu_preset_loads():
    config = load_run("model-cpu")
    assert config.workload == "model_step" and max(config.seq_len) >= 32768
    assert {v.name for v in config.variants} >= {"full", "sliding_window", "nystrom"}
