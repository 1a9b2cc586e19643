"""bench.quality.reach: which recall distances a mask can answer, against hand-derived cases.

Notation: N = 256 positions, the query at q = 255, the key at k = q - d, its value at
v = k - gap, L layers. The pair must meet at some p after l layers (1 <= l <= L - 1) and p
must reach q in the other L - l layers.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from attn import create_attention
from bench.quality import plots
from bench.quality.reach import answer_reachable, flow_matrix, recall_reach, variant_recall_reach
from bench.quality.settings import task_settings

N = 256
DISTANCES = (8, 16, 32, 64, 128, 192)
EVERY = tuple(range(2, N - 2))  # every distance gap 1 allows (gap 2: up to N - 3)


def _module(name: str, **params):
    return create_attention(name, num_heads=4, head_dim=16, **params)


def test_sliding_window_reaches_two_windows_less_the_gap():
    # |i - j| <= 16 per layer. L = 2: p >= q - 16 (one hop to q) and p <= v + 16 (one hop to
    # v): d <= 2 * 16 - gap = 31. d = 8, 16 fit; d = 64 does not.
    sw = _module("sliding_window", window=16)
    found = recall_reach(sw, seq_len=N, layers=2, distances=DISTANCES, pair_gap=1)
    assert found.reachable == (8, 16)
    assert found.reach == 31 and found.largest == N - 2
    assert not answer_reachable(sw, layers=2, seq_len=N, key=N - 1 - 64, value=N - 2 - 64)


@pytest.mark.parametrize(("window", "layers", "gap"), [(16, 2, 1), (16, 3, 1), (16, 2, 2), (5, 4, 3)])
def test_sliding_window_reach_is_layers_times_window_less_the_gap(window, layers, gap):
    # meet at l layers, then L - l hops: p >= q - (L - l) w and p <= v + l w, so
    # d <= L w - gap, whichever l.
    found = recall_reach(_module("sliding_window", window=window), seq_len=N, layers=layers,
                         distances=EVERY[: N - 2 - gap], pair_gap=gap)
    assert found.reach == layers * window - gap
    assert found.reachable == tuple(range(2, layers * window - gap + 1))  # no holes below it


def test_dilation_2_with_adjacent_pairs_reaches_no_distance():
    # (i - j) % 2 == 0 on every head, and i -> i: A^l only links equal parity, while a value
    # right before its key has the other parity, so no p ever holds both. Today's layout
    # (pair_gap 1) is unreachable for dilated at every distance and every depth.
    dilated = _module("dilated", window=16, dilation=2)
    for layers in (2, 3, 4):
        found = recall_reach(dilated, seq_len=N, layers=layers, distances=EVERY, pair_gap=1)
        assert found.reachable == () and found.reach is None


def test_dilation_2_with_gap_2_reaches_even_distances_within_its_window():
    # gap 2, d even: k, v, q all odd; on the odd positions dilation 2 is a window of 16 steps
    # of 2 tokens, the pair one step apart: d / 2 <= 2 * 16 - 1, d <= 62. d odd: k, v even,
    # q odd, never linked.
    dilated = _module("dilated", window=16, dilation=2)
    found = recall_reach(dilated, seq_len=N, layers=2, distances=DISTANCES, pair_gap=2)
    assert found.reachable == (8, 16, 32) and found.reach == 62
    every = recall_reach(dilated, seq_len=N, layers=2, distances=EVERY[:-1], pair_gap=2)
    assert every.reachable == tuple(range(2, 63, 2))


def test_full_attention_reaches_every_distance():
    # A is all ones: p = q holds both after one layer, whatever d.
    found = recall_reach(_module("full"), seq_len=N, layers=2, distances=EVERY, pair_gap=1)
    assert found.reachable == EVERY and found.reach == N - 2


def test_global_tokens_reach_every_distance_through_a_global_position():
    # position 0 is global: it attends to every k and v (layer 1), and q attends to it
    # (layer 2), so p = 0 works for every d although the window alone reaches 31.
    gt = _module("global_tokens", num_global=4, window=16)
    found = recall_reach(gt, seq_len=N, layers=2, distances=EVERY, pair_gap=1)
    assert found.reachable == EVERY
    no_globals = _module("global_tokens", num_global=0, window=16)
    assert recall_reach(no_globals, seq_len=N, layers=2, pair_gap=1).reach == 31


def test_one_layer_never_reaches_and_the_matrix_keeps_the_residual():
    # L = 1: no layer is left to bind the pair before the query reads it, even with full attention.
    assert recall_reach(_module("full"), seq_len=N, layers=1, distances=EVERY).reach is None
    flow = flow_matrix(_module("dilated", window=0, dilation=2), 8)
    assert torch.equal(flow, torch.eye(8, dtype=torch.bool))  # window 0: only i -> i


def test_a_mask_mod_counts_the_union_of_its_heads():
    def one_way(b, h, i, j):  # head 0 looks one to the left, head 1 one to the right
        return torch.where(h == 0, j == i - 1, j == i + 1)

    left = flow_matrix(one_way, 6, heads=1)
    both = flow_matrix(one_way, 6, heads=2)
    eye = torch.eye(6, dtype=torch.bool)
    assert torch.equal(left, eye | torch.diag(torch.ones(5, dtype=torch.bool), -1))
    assert torch.equal(both, left | torch.diag(torch.ones(5, dtype=torch.bool), 1))
    # left-looking only: q = 5 gathers from everything to its left; key 3, value 2 meet at 3
    assert answer_reachable(one_way, layers=3, seq_len=6, key=3, value=2)
    assert not answer_reachable(one_way, layers=3, seq_len=6, key=1, value=0)  # too far


def _per_head_dilated():
    try:
        return create_attention("dilated", window=16, dilation=(1, 2), num_heads=4, head_dim=16)
    except (TypeError, ValueError) as error:
        pytest.skip(f"dilated does not take per-head dilations (dilation=(1, 2)) yet: {error}")


def test_per_head_dilations_bind_both_parities():
    # union of a window-16 head and a dilation-2 head. gap 1, L = 2: q odd, so p >= q - 32
    # if p is odd (dilation-2 head), else p >= q - 16. One of k, v has p's parity (<= 32
    # away), the other not (<= 16 away). p odd: d even with p <= v + 16 (d <= 46), d odd with
    # p <= k + 16 (d <= 47). So d = 8, 16, 32 reach, 64 does not, the reach is 47.
    mixed = _per_head_dilated()
    found = recall_reach(mixed, seq_len=N, layers=2, distances=DISTANCES, pair_gap=1)
    assert found.reachable == (8, 16, 32) and found.reach == 47


def test_the_task_settings_give_the_reach_the_plot_draws():
    settings = task_settings("recall", "small").to_dict()  # 2 layers, window 16, gap 2
    sw = variant_recall_reach("sliding_window", {}, settings)
    dilated = variant_recall_reach("dilated", {"dilation": 2}, settings)
    assert (sw.reachable, sw.reach) == ((8, 16), 30)
    assert (dilated.reachable, dilated.reach) == ((8, 16, 32), 62)
    assert variant_recall_reach("full", {}, settings).reachable == DISTANCES


def test_the_recall_plot_marks_the_computed_reach_and_both_chance_lines(tmp_path, monkeypatch):
    settings = task_settings("recall", "small").to_json()
    rows = []
    for variant, params in (("sliding_window", {"window": 16}), ("full", {}),
                            ("dilated", {"window": 16, "dilation": 2})):
        label = f"{variant}{params}"
        for d in DISTANCES:
            rows.append({"task": "recall", "split": "test", "metric": "accuracy",
                         "condition": f"distance={d}", "status": "ok", "label": label,
                         "variant": variant, "params": json.dumps(params), "settings": settings,
                         "value": 0.5})
        rows.append({**rows[-1], "metric": "majority_accuracy", "condition": "", "value": 0.2})
    df = pd.DataFrame(rows)
    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, run_dir, stem: drawn.setdefault("fig", fig))
    plots.plot_condition(df, tmp_path, "recall")
    fig = drawn["fig"]
    ax = fig.axes[0]
    vertical = sorted(line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":")
    assert vertical == [30, 62]  # sliding window and dilated; full reaches every distance
    names = ax.get_legend_handles_labels()[1]
    assert "uniform chance (1/8)" in names and "majority class" in names
    chance = [line for line in ax.lines if line.get_label() == "uniform chance (1/8)"]
    assert chance[0].get_ydata()[0] == pytest.approx(1 / 8)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_recall_task_writes_the_preset_pair_gap():
    from bench.quality.data.recall import Layout
    from bench.quality.tasks import get_task

    settings = task_settings("recall", "tiny")
    assert settings.data["pair_gap"] == 2
    task = get_task("recall", settings.data, seed=0)
    task.prepare()
    d = settings.data
    base = Layout(d["num_keys"], d["num_values"], d["num_fillers"]).value_base
    split = task.splits["train"]
    ids, labels, distance = split["ids"], split["labels"], split["distance"]
    rows = torch.arange(len(ids))
    value_at = ids[rows, d["seq_len"] - 1 - distance - 2]  # the value 2 before the target key
    assert torch.equal(value_at, base + labels)
