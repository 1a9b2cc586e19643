"""The packing and pad_fraction axes of speed sweeps: lengths, config, cases, FLOPs, ratios."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attn import create_attention
from bench.engine.config import ConfigError
from bench.speed.cases import expand_cases
from bench.speed.config import parse_config
from bench.speed.flops import case_flops
from bench.speed.packing import document_ids, document_lengths, padding_mask
from bench.speed.report import packing_ratios

BASE = {"name": "t", "seq_len": [64], "variants": [{"name": "full"}]}


@pytest.mark.parametrize(("n", "documents"), [(32768, 8), (100, 7), (10, 10), (64, 1)])
def test_document_lengths_sum_to_n_and_are_seeded(n, documents) -> None:
    lengths = document_lengths(n, documents)
    assert len(lengths) == documents and sum(lengths) == n and min(lengths) >= 1
    assert lengths == document_lengths(n, documents)  # the same lengths in every run
    if n >= 100 * documents:  # weights in [0.5, 1.5): no document above 3x another (+ rounding)
        assert max(lengths) <= 3 * min(lengths) + 1


def test_document_lengths_refuse_more_documents_than_tokens() -> None:
    with pytest.raises(ValueError, match="packing: must be between 1 and N=4 documents; got 5"):
        document_lengths(4, 5)


def test_document_ids_and_padding_mask() -> None:
    assert document_ids([2, 1, 3], batch=2).tolist() == [[0, 0, 1, 2, 2, 2]] * 2
    mask = padding_mask(8, 2, 0.25)
    assert mask.tolist() == [[True] * 6 + [False] * 2] * 2
    assert padding_mask(4, 1, 0.99).sum() == 1  # one key stays real


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"packing": [-1]}, "'packing': must be an integer >= 0 or a list of them; got -1"),
    ({"pad_fraction": [1.0]}, "'pad_fraction': must be a number in [0, 1) or a list of them; got [1.0]"),
    ({"one_by_one": "yes"}, "'one_by_one': must be true or false"),
])
def test_bad_packing_keys_are_refused_naming_the_key(changes, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({**BASE, **changes})
    assert fragment in str(err.value)


def test_packing_expands_into_cases_timed_together() -> None:
    config = parse_config({**BASE, "packing": [0, 4], "one_by_one": True, "pad_fraction": [0.0, 0.5]})
    cases = expand_cases(config)
    assert [c.packing for c in cases] == ["", "pad 0.5", "packed 4 docs", "packed 4 docs, pad 0.5",
                                          "4 docs one by one", "4 docs one by one, pad 0.5"]
    assert cases[2].label == "full [packed 4 docs]"
    assert len({c.comparison for c in cases}) == 1  # one chain: interleaved in the same rounds
    assert len({c.group for c in cases}) == len(cases)  # each its own curve
    assert len({c.case_id for c in cases}) == len(cases)
    plain = expand_cases(parse_config(BASE))[0]
    assert plain.case_id == cases[0].case_id  # unpacked cases keep their ids


def test_packed_flops_count_the_documents_pairs_only() -> None:
    module = create_attention("full", num_heads=2, head_dim=8)
    lengths = document_lengths(64, 4)
    flops, kind, density = case_flops(module, batch=1, heads=2, n=64, head_dim=8, causal=False, documents=4)
    assert kind == "useful"
    assert flops["fwd"] == 4 * 2 * 8 * sum(m * m for m in lengths)  # 4 * B * H * D * pairs
    assert density == pytest.approx(sum(m * m for m in lengths) / 64**2)


def _row(packing: str, times: list[float], unit: str = "u1") -> dict:
    return {"status": "ok", "interleaved": 3, "interleave_id": unit, "pass": "fwd", "packing": packing,
            "label": f"full [{packing}]" if packing else "full", "seq_len": 64, "kernel_requested": "auto",
            "kernel": "blocked" if packing.startswith("packed") else "sdpa",
            "time_ms": sorted(times)[len(times) // 2], "times_ms": json.dumps(times), "density": 0.2}


def test_packing_ratios_are_per_round_against_unpacked_and_one_by_one() -> None:
    df = pd.DataFrame([_row("", [10.0, 20.0, 10.0]), _row("packed 4 docs", [2.0, 2.0, 3.0]),
                       _row("4 docs one by one", [4.0, 2.0, 2.0])])
    table = packing_ratios(df)
    packed = table[table.label == "full [packed 4 docs]"].iloc[0]
    assert packed.vs_unpacked == "0.2 [0.15, 0.25]"  # per-round ratios 0.2, 0.1, 0.3
    assert packed.vs_one_by_one == "1 [0.75, 1.25]"  # per-round ratios 0.5, 1.0, 1.5
    twin = table[table.label == "full [4 docs one by one]"].iloc[0]
    assert twin.vs_one_by_one == ""


def test_packed_rows_keep_their_packing_in_the_label_when_read() -> None:
    from bench.speed.results import _packed_label

    label = "sliding_window(window=16) [packed 4 docs]"
    assert _packed_label("sliding_window", '{"window": 16}', label, "packed 4 docs") == label
    assert _packed_label("sliding_window", '{"window": 16}', "sliding_window(window=16)", "") == (
        "sliding_window(window=16)")


def test_the_committed_packed_run_reports_its_ratios() -> None:
    from pathlib import Path

    from bench.speed.results import load_results

    run = Path(__file__).resolve().parents[1] / "results" / "packed-cpu"
    df = load_results(run)
    table = packing_ratios(df)
    assert set(table.label) == {"full [packed 8 docs]", "full [8 docs one by one]",
                                "causal [packed 8 docs]", "causal [8 docs one by one]"}
    packed = table[table.label.str.contains("packed")]
    assert set(packed.kernel) == {"blocked"} and packed.vs_one_by_one.str.len().gt(0).all()
