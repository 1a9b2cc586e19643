"""Grouped-query attention in the models, the decoding benchmark and the speed sweeps:
``num_kv_heads`` is validated, the KV cache stores only H_kv heads and decoding stays exact;
``--num-kv-heads`` measures the cache's bytes; ``kv_heads`` is a sweep axis whose key-head
counts share their interleaved rounds, and the report divides them per kernel."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from attn import PlainModuleAttention, register_attention
from attn.registry import unregister_attention
from bench.decoding.benchmark import cache_bytes
from bench.decoding.options import DecodingOptions
from bench.engine.config import ConfigError
from bench.speed.cases import chains, expand_cases
from bench.speed.config import parse_config
from bench.speed.report import gqa_ratios
from models import create_model


def test_num_kv_heads_defaults_to_num_heads_and_must_divide_it() -> None:
    assert create_model("decoder_lm", num_heads=4, d_model=32).config.num_kv_heads == 4
    with pytest.raises(ValueError, match=r"num_kv_heads: must divide num_heads=4 \(each key head serves "
                                         r"num_heads / num_kv_heads query heads\); got 3"):
        create_model("decoder_lm", num_heads=4, d_model=32, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"num_kv_heads: must be an integer >= 1; got 0"):
        create_model("decoder_lm", num_heads=4, d_model=32, num_kv_heads=0)


def test_an_attention_without_gqa_support_refuses_fewer_key_heads() -> None:
    class EqualHeads(torch.nn.Module):
        """Full attention for equal heads only."""

        def forward(self, q, k, v, *, causal=False, key_mask=None):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    register_attention("equal_heads_only_test")(EqualHeads)
    try:
        assert isinstance(create_model("encoder_classifier", attention="equal_heads_only_test", num_heads=2)
                          .encoder.blocks[0].self_attn.attention, PlainModuleAttention)
        with pytest.raises(ValueError, match=r"num_kv_heads: must equal num_heads=2 with attention "
                                             r"'equal_heads_only_test', which does not support grouped-query"):
            create_model("encoder_classifier", attention="equal_heads_only_test", num_heads=2, num_kv_heads=1)
    finally:
        unregister_attention("equal_heads_only_test")


@pytest.mark.parametrize(("name", "params"), [("full", {}), ("dilated", {"window": 2, "dilation": (1, 2)})])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_cached_decoding_is_exact_and_the_cache_holds_only_the_key_heads(name, params, kv_heads) -> None:
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention=name, attention_params=params, num_heads=4, d_model=32,
                         num_kv_heads=kv_heads, norm="pre").eval()
    attention = model.blocks[0].self_attn
    assert attention.k_proj.out_features == kv_heads * 8 and attention.q_proj.out_features == 32
    seq = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(seq[:, :5], cache=cache)[:, -1]]
        steps += [model(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(5, 15)]
        full = model(seq[:, :-1])[:, 4:]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].k.shape[1] == kv_heads  # (B, H_kv, T, Dh)
    assert torch.equal(model.generate(seq[:, :5], 3), model.generate(seq[:, :5], 3, use_cache=False))


def test_the_cache_bytes_shrink_by_the_group_size() -> None:
    prompt = torch.randint(0, 32, (1, 20), generator=torch.Generator().manual_seed(2))
    held = {}
    for kv in (8, 1):
        torch.manual_seed(0)
        model = create_model("decoder_lm", num_heads=8, d_model=64, num_kv_heads=kv).eval()
        with torch.no_grad():
            held[kv] = cache_bytes(model, prompt, 4)
    # 2 layers x (k + v) x 23 positions (in buffers of capacity 40) x H_kv x 8 dims x 4 bytes
    assert held[8] == 2 * 2 * 40 * 8 * 8 * 4
    assert held[8] == 8 * held[1]


def test_decoding_options_check_num_kv_heads() -> None:
    assert DecodingOptions(num_heads=4).kv_heads == (4,)
    assert DecodingOptions(num_heads=4, num_kv_heads=(4, 1)).kv_heads == (4, 1)
    with pytest.raises(ValueError, match=r"--num-kv-heads: must divide --num-heads=4 .*; got 3"):
        DecodingOptions(num_heads=4, num_kv_heads=(3,))


# ---- sweeps ---------------------------------------------------------------------------------

BASE = {"name": "t", "seq_len": [128], "heads": 8, "variants": [{"name": "sliding_window", "window": 4,
                                                                 "kernels": ["blocked", "sdpa"]}]}


def test_kv_heads_is_validated_against_heads() -> None:
    with pytest.raises(ConfigError, match=r"config key 'kv_heads': each value must divide every heads "
                                          r"value \[8\] \(H % H_kv == 0\); got 3 for heads=8"):
        parse_config({**BASE, "kv_heads": [8, 3]})
    with pytest.raises(ConfigError, match=r"'kv_heads': must be an integer >= 1"):
        parse_config({**BASE, "kv_heads": [0]})


def test_kv_heads_cases_share_their_rounds_and_multi_head_ids_do_not_change() -> None:
    plain = expand_cases(parse_config(BASE))
    swept = expand_cases(parse_config({**BASE, "kv_heads": [8, 2]}))
    assert [c.key_heads for c in swept] == [8, 2, 8, 2]
    # a multi-head case keeps the id a sweep without the axis gives it (resumes stay valid)
    assert {c.case_id for c in plain} == {c.case_id for c in swept if c.key_heads == 8}
    assert len({c.case_id for c in swept}) == 4
    [[group]] = chains(swept, interleave=True)  # one chain, one length: all four timed together
    assert sorted((c.kernel, c.key_heads) for c in group) == [("blocked", 2), ("blocked", 8),
                                                            ("sdpa", 2), ("sdpa", 8)]
    assert "H=8 H_kv=2" in swept[1].describe()


def test_gqa_ratios_divide_each_kernel_by_its_own_multi_head_row_round_by_round() -> None:
    def row(kernel, kv, times):
        return {"status": "ok", "interleaved": 4, "interleave_id": "u", "pass": "fwd", "label": "sw",
                "seq_len": 128, "kernel_requested": kernel, "kernel": kernel, "heads": 8, "kv_heads": kv,
                "times_ms": json.dumps(times), "peak_mem_bytes": 100.0 * kv, "kernel_path": "p"}

    df = pd.DataFrame([row("blocked", 8, [10, 20, 10]), row("blocked", 2, [5, 30, 10]),
                       row("sdpa", 8, [4, 4, 4]), row("sdpa", 2, [2, 2, 2])])
    table = gqa_ratios(df).set_index("kernel")
    assert table.loc["blocked", "time_ratio"] == pytest.approx(1.0)  # median of 0.5, 1.5, 1.0
    assert table.loc["blocked", "ratio_q25"] == pytest.approx(0.75)
    assert table.loc["sdpa", "time_ratio"] == pytest.approx(0.5)
    assert table.loc["sdpa", "memory_ratio"] == pytest.approx(0.25)
    assert list(table.kv_heads) == [2, 2]
