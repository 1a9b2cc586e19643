"""``attn-bench plot --patterns``: every registered variant's allowed pairs, drawn from an
example parameter set that one head can show (per-head patterns are skipped, not fatal)."""

from __future__ import annotations

import numpy as np

from attn import attention_info
from bench.quality.plots import _illustrative_pattern, plot_patterns


def test_the_patterns_figure_is_drawn_for_every_variant(tmp_path):
    written = plot_patterns(tmp_path, n=16)
    assert {p.suffix for p in written} == {".png", ".svg"}
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_per_head_example_is_skipped_for_a_one_head_drawing():
    examples = attention_info("dilated").example_params
    assert any(isinstance(p.get("dilation"), tuple) for p in examples)  # the kit's per-head case
    params, grid = _illustrative_pattern("dilated", examples, 16)
    assert isinstance(params["dilation"], int)
    i, j = np.indices(grid.shape)
    offset = i - j
    expected = (offset % params["dilation"] == 0) & (np.abs(offset) <= params["dilation"] * params["window"])
    assert (grid.astype(bool) == expected).all()
