"""Recall against state (docs/quality.md): the bytes a layer keeps to answer, per kind of pattern against its
formula and against the tensors a decoder actually holds; the report's figure and table, and its one-line skip;
a real training run's rows carrying the columns."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from baseline_packages import baselines_registered

from bench.engine.results import ResultsWriter
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.quality.grid import QUALITY_FILE
from bench.quality.plots import plot_quality_run
from bench.quality.report import build_quality_report, load_quality
from bench.quality.settings import task_settings
from bench.quality.state import DECODING_STATE, KV_ALL, KV_BAND, RECURRENT, layer_state, model_state
from bench.quality.state_table import FIGURE, state_points
from bench.quality.tables import headline
from models import create_model
from models.attention import MultiHeadAttention, StateCache
from models.recurrent import RecurrentCache

N, HEADS, HEAD_DIM, FLOAT32 = 40, 4, 8, 4  # N not a power of two: a grown buffer's capacity is not N


@pytest.mark.parametrize(("name", "params", "kv_heads", "kept", "rule"), [
    ("full", {}, HEADS, N, KV_ALL),
    ("full", {}, 2, N, KV_ALL),  # grouped-query: the cache has the key heads only
    ("causal", {}, HEADS, N, KV_ALL),
    ("sliding_window", {"window": 5}, HEADS, 5 + 1, KV_BAND),  # |i - j| <= w: w keys and the newest
    ("sliding_window", {"window": 50}, HEADS, N, KV_BAND),  # a window past the sequence keeps N
    ("global_tokens", {"num_global": 3, "window": 5}, HEADS, 3 + 5 + 1, KV_BAND),
    ("dilated", {"window": 4, "dilation": 3}, HEADS, 3 * 4 + 1, KV_BAND),  # the span, every residue
    ("dilated", {"window": 4, "dilation": [1, 3]}, HEADS, 3 * 4 + 1, KV_BAND),  # the widest group's
], ids=["full", "full-gqa", "causal", "window", "window-past-n", "global", "dilated", "dilated-mix"])
def test_kv_cache_bytes_of_the_patterns_equal_the_formula(name, params, kv_heads, kept, rule):
    layer = MultiHeadAttention(HEADS * HEAD_DIM, HEADS, name, params, num_kv_heads=kv_heads)
    state = layer_state(layer, N)
    assert state.nbytes == 2 * kept * kv_heads * HEAD_DIM * FLOAT32
    assert state.rule == rule and f"2 x {kept} of {N} tokens" in state.detail
    assert state.columns()["state_rule"].startswith(rule + ": ")


def _held(holder: object) -> int:
    """Bytes of the tensors an object holds as its attributes."""
    return sum(t.numel() * t.element_size() for t in vars(holder).values() if isinstance(t, torch.Tensor))


#: the decoding state of each mixer per layer, in float32 numbers (H heads of D x Dv, + the normaliser)
MIXERS = {"retention": HEADS * HEAD_DIM * (HEAD_DIM + 1), "gla": HEADS * HEAD_DIM * HEAD_DIM,
          "ssd": HEADS * HEAD_DIM * HEAD_DIM, "linear_attention": HEADS * HEAD_DIM * (HEAD_DIM + 1),
          "lstm": 2 * HEADS * HEAD_DIM}  # h and c of d_model units


@pytest.mark.parametrize("name", list(MIXERS))
def test_a_mixer_state_is_what_its_decoder_holds_after_decoding(name):
    """Decode a prompt and three tokens through the model's own cache; the state counted for the row is
    the bytes the layer's cache then holds, the formula's, and it does not grow with the length."""
    mixer = {"mixer": "lstm"} if name == "lstm" else {}
    with baselines_registered():
        torch.manual_seed(0)
        model = create_model("decoder_lm", "mini", attention="full" if mixer else name, d_model=HEADS * HEAD_DIM,
                             num_heads=HEADS, num_layers=2, vocab_size=20, **mixer).eval()
        ids = torch.randint(0, 20, (1, 8))
        cache = model.new_cache()
        with torch.no_grad():
            model(ids[:, :5], cache=cache)
            for t in range(5, 8):
                model(ids[:, t : t + 1], cache=cache)
        layer = cache.layers[0]
        holder = layer.state if isinstance(layer, StateCache) else layer
        assert isinstance(holder, RecurrentCache) == bool(mixer)
        counted = model_state(model, 8)
        assert counted.nbytes == _held(holder) == MIXERS[name] * FLOAT32
        assert counted.rule == (RECURRENT if mixer else DECODING_STATE)
        assert model_state(model, 64).nbytes == counted.nbytes


def _rows(task: str, label: str, values: dict[int, float], *, width: int = 16, state: int | None = None,
          variant: str = "", params: str = "{}", role: str = "variant", overrides: dict | None = None
          ) -> list[dict]:
    settings = task_settings(task, "tiny", {"model": {"d_model": width}}).to_json()
    model = {**(overrides or {}).get("model", {}), **({"d_model": width} if width != 16 else {})}
    overrides = {**(overrides or {}), **({"model": model} if model else {})}
    return [{"unit_id": f"{task}-{label}-{width}-{seed}", "task": task, "variant": variant or label,
             "label": label, "params": params, "seed": seed, "preset": "tiny", "split": "test",
             "metric": "accuracy", "condition": "", "value": value, "status": "ok", "settings": settings,
             "role": role, "overrides": json.dumps(overrides) if overrides else "", "steps": 8,
             "train_tokens_per_s": 1000.0, "state_bytes": state,
             "state_rule": "" if state is None else "kv_cache(band): synthetic",
             "timestamp": "2026-01-01T00:00:00+00:00"} for seed, value in values.items()]


def _write(tmp_path, rows: list[dict], columns: list[str] = QUALITY_COLUMNS) -> pd.DataFrame:
    ResultsWriter(tmp_path, rows, QUALITY_FILE, columns)
    return load_quality(tmp_path)


def test_the_figure_and_table_show_each_pattern_at_each_width(tmp_path):
    lstm = {"model": {"mixer": "lstm"}}
    rows = [*_rows("mqar", "full", {0: 0.9, 1: 0.7}, state=131072),
            *_rows("mqar", "full", {0: 1.0, 1: 0.8}, width=32, state=262144),
            *_rows("mqar", "sliding_window", {0: 0.3, 1: 0.3, 2: 0.3}, state=8704,
                   params=json.dumps({"window": 16})),
            *_rows("mqar", "full", {0: 0.2, 1: 0.4}, width=32, state=1024, role="reference",
                   overrides=lstm),
            *_rows("mqar", "present_value", {0: 0.25}, role="reference")]  # a computed floor: no state
    top = headline(_write(tmp_path, rows))
    points = state_points(top).set_index(["width", "label"])
    assert sorted(points.index) == [(16, "full"), (16, "sliding_window(window=16)"), (32, "full"),
                                    (32, "lstm (no attention)")]  # the width is the panel, not the name
    assert points.loc[(16, "full"), "state_bytes"] == 131072
    assert points.loc[(32, "full"), "state_bytes"] == 262144
    assert points.loc[(16, "full"), "mean"] == pytest.approx(0.8)
    assert points.loc[(16, "full"), "std"] == pytest.approx(0.1414, abs=1e-3)  # seed spread: the error bar
    text = build_quality_report(tmp_path)
    section = text.split("## Recall against state", 1)[1].split("\n## ", 1)[0]
    assert f"[{FIGURE}.png]({FIGURE}.png)" in section
    assert "| mqar | full | kv_cache(band) | 131,072 B | 80.0 ± 14.1 | 262,144 B | 90.0 ± 14.1 |" in section
    assert "| mqar | sliding_window(window=16) | kv_cache(band) | 8,704 B | 30.0 ± 0.0 | - | - |" in section
    assert "lstm (no attention) (reference)" in section
    assert "| mqar | a value the sequence holds, at random (expected) (floor) | none | - | 25.0 | - | 25.0 |" in section
    paths = {p.name for p in plot_quality_run(tmp_path)}
    assert {f"{FIGURE}.png", f"{FIGURE}.svg"} <= paths and (tmp_path / f"{FIGURE}.png").stat().st_size > 0


def test_an_entry_with_its_own_training_recipe_is_a_panel_of_its_own(tmp_path):
    recipe = {"train": {"lr": 0.001}}
    rows = [*_rows("mqar", "full", {0: 0.9}, width=32, state=262144),
            *_rows("mqar", "full", {0: 0.2}, width=32, state=262144, overrides=recipe),
            *_rows("mqar", "sliding_window", {0: 0.1}, width=32, state=8704, overrides=recipe,
                   params=json.dumps({"window": 16}))]
    points = state_points(headline(_write(tmp_path, rows))).set_index(["width", "recipe", "label"])
    assert sorted(points.index) == [(32, "", "full"), (32, "train.lr=0.001", "full"),
                                    (32, "train.lr=0.001", "sliding_window(window=16)")]
    assert points.loc[(32, "train.lr=0.001", "full"), "mean"] == pytest.approx(0.2)  # not averaged with 0.9
    section = build_quality_report(tmp_path).split("## Recall against state", 1)[1].split("\n## ", 1)[0]
    assert "accuracy % (d_model=32) | state (d_model=32, train.lr=0.001) | accuracy % (d_model=32, train.lr=0.001)" \
        in section
    assert "| mqar | full | kv_cache(band) | 262,144 B | 90.0 | 262,144 B | 20.0 |" in section


@pytest.mark.parametrize("case", ["no recall task", "no state column"])
def test_without_recall_rows_or_their_state_there_is_no_figure(tmp_path, case):
    if case == "no recall task":
        _write(tmp_path, _rows("listops", "full", {0: 0.5}, state=4096))
    else:  # a file written before the columns existed
        _write(tmp_path, _rows("recall", "full", {0: 0.5, 1: 0.6}, state=4096),
               QUALITY_COLUMNS[:QUALITY_COLUMNS.index("state_bytes")])
    text = build_quality_report(tmp_path)
    if case == "no recall task":  # a grid without recall tasks has no such section at all
        assert "## Recall against state" not in text
    else:
        section = text.split("## Recall against state\n\n", 1)[1].split("\n\n", 1)[0]
        assert section.startswith("No figure: ") and "\n" not in section and "state_bytes" in section
    assert FIGURE not in {p.stem for p in plot_quality_run(tmp_path)}
    assert not (tmp_path / f"{FIGURE}.png").exists()


def test_a_tiny_training_run_and_a_reference_fill_the_columns(tmp_path):
    from bench.quality.reference_unit import reference_rows
    from bench.quality.train import RunSpec, train_run

    overrides = {"train": {"steps": 2, "eval_every": 2, "checkpoint_every": 2}, "data": {"reader": "decoder"}}
    spec = RunSpec(task="mqar", variant="sliding_window", preset="tiny", seed=0, out=str(tmp_path / "run"),
                   overrides=overrides)
    rows = train_run(spec, log=lambda _: None)
    settings = task_settings("mqar", "tiny", overrides)
    model, window = settings.model, settings.attention["window"]
    heads, seq_len = model["num_heads"], settings.data["seq_len"]
    expected = 2 * min(window + 1, seq_len) * heads * (model["d_model"] // heads) * FLOAT32
    assert rows and all(r["state_bytes"] == expected for r in rows)
    assert all(r["state_rule"].startswith(KV_BAND + ": ") for r in rows)
    reference = reference_rows("mqar", "present_value", settings.data, 0)
    assert reference and all(r["state_bytes"] is None and r["state_rule"].startswith("none: ") for r in reference)
    stored = _write(tmp_path, [{**r, "unit_id": "u", "timestamp": "2026-01-01T00:00:00+00:00"} for r in rows])
    assert (stored.state_bytes == expected).all()  # a column of the results file, read back as a number
