"""``interleave: variants`` (bench/speed/cases.py): every variant of one shape at one length is
timed in the same rounds, so ratios between variants (full against factorised) share the load."""

from __future__ import annotations

import pytest

from bench.engine.config import ConfigError
from bench.speed.cases import chains, expand_cases
from bench.speed.config import parse_config

RAW = {
    "name": "t", "device": "cpu", "passes": ["fwd"], "heads": 2, "head_dim": 8, "seq_len": [16, 32],
    "variants": [{"name": "full"}, {"name": "factorised", "positions_per_frame": 8, "seq_len": [16, 32, 64]}],
}


def test_variants_share_a_unit_at_each_length() -> None:
    config = parse_config({**RAW, "interleave": "variants"})
    (chain,) = chains(expand_cases(config), config.interleave)
    assert [sorted(c.variant for c in group) for group in chain] == [
        ["factorised", "full"], ["factorised", "full"], ["factorised"]]


def test_by_default_each_variant_is_its_own_chain() -> None:
    config = parse_config(RAW)
    assert len(chains(expand_cases(config), config.interleave)) == 2


def test_bad_interleave_names_the_key() -> None:
    with pytest.raises(ConfigError, match="interleave.*must be true, false or 'variants'"):
        parse_config({**RAW, "interleave": "kernels"})
