"""Reference rows without attention: each scoring function against a hand computation or a
property that a wrong one breaks, and the rows a grid records for them (ids, staleness, the
report's strongest-reference table)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from bench.engine.config import ConfigError
from bench.quality.grid import run_grid, superseded_units
from bench.quality.grid_config import parse_grid
from bench.quality.margins import (
    BELOW,
    CLEARS,
    ONE_SEED,
    SHORT,
    margins,
    strongest_references,
    unlearned_tasks,
)
from bench.quality.reference import counts, get_reference, list_references, translation
from bench.quality.reference.bytes_model import (
    NGramModel,
    compressed_bits_per_byte,
    ngram_bits_per_byte,
    scored_windows,
)
from bench.quality.reference_unit import ReferenceUnit, reference_rows
from bench.quality.report import build_quality_report, load_quality
from bench.quality.settings import task_settings
from bench.quality.tasks import get_task
from bench.quality.units import units


def _next_byte_bits(model: NGramModel, context: list[int]) -> np.ndarray:
    """Bits of every possible next byte after ``context`` (one window per candidate)."""
    windows = np.array([[*context, b] for b in range(256)])
    return np.array([model.window_bits(w[None, :]) - model.window_bits(w[None, :-1])
                     for w in windows])


def test_the_ngram_model_is_a_distribution_and_matches_witten_bell_by_hand():
    train = np.frombuffer(b"abracadabra abracadabra", dtype=np.uint8)
    model = NGramModel(1).fit(train)
    bits = _next_byte_bits(model, [ord("a")])
    assert np.exp2(-bits).sum() == pytest.approx(1.0, abs=1e-9)
    # after "a": b x4, c x2, d x2, " " x1 -> C = 9, T = 4; order 0: 23 bytes, 6 distinct
    order0_b = (4 + 6 / 256) / (23 + 6)
    expected = (4 + 4 * order0_b) / (9 + 4)
    assert 2.0 ** -bits[ord("b")] == pytest.approx(expected, rel=1e-12)
    unseen = (0 + 4 * (0 + 6 / 256) / 29) / 13  # "z" never seen: only the uniform share
    assert 2.0 ** -bits[ord("z")] == pytest.approx(unseen, rel=1e-12)


def test_the_ngram_model_reads_no_context_across_a_window_start():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 4, 5000).astype(np.uint8)
    high, low = NGramModel(4).fit(train), NGramModel(1).fit(train)
    window = np.array([[1, 2, 3]])
    # the first target of a window has one byte before it: order 4 must predict it as order 1
    assert high.window_bits(window[:, :2]) == pytest.approx(low.window_bits(window[:, :2]))
    # rows are scored independently: a batch is the sum of its rows
    windows = rng.integers(0, 4, (3, 9))
    assert high.window_bits(windows) == pytest.approx(sum(high.window_bits(w[None]) for w in windows))


def test_the_scored_windows_are_the_bytes_the_language_model_task_scores():
    stream = torch.arange(1000) % 251
    length, budget = 64, 700
    count = max(1, min(budget, len(stream) - 1) // length)  # ByteLM.bits_per_byte
    expected = stream[: count * length + 1].unfold(0, length + 1, length).numpy()
    np.testing.assert_array_equal(scored_windows(stream.numpy(), length, budget), expected)


def test_more_context_never_costs_bits_on_text_it_has_seen_and_compressors_see_redundancy():
    text = np.frombuffer(b"the cat sat on the mat. " * 200, dtype=np.uint8)
    windows = scored_windows(text, 64, 2048)
    bits = [ngram_bits_per_byte(text, windows, k) for k in (0, 1, 2, 4)]
    assert bits == sorted(bits, reverse=True) and bits[-1] < 0.1
    assert compressed_bits_per_byte(windows, "xz") < 1.0
    noise = np.random.default_rng(1).integers(0, 256, 4097).astype(np.uint8)
    assert compressed_bits_per_byte(scored_windows(noise, 64, 4096), "gzip") > 7.9
    with pytest.raises(ValueError, match=r"compressor: unknown value 'zip'; allowed values are \['gzip', 'xz'\]"):
        compressed_bits_per_byte(windows, "zip")
    with pytest.raises(ValueError, match="order: must be an integer from 0 to 7"):
        NGramModel(9)


def test_token_counts_skip_padding_and_bytes_decode_back_to_text():
    ids = np.array([[3, 3, 1, 0], [2, 0, 0, 0]])
    mask = ids > 0
    found = counts.token_counts(ids, 4, mask).toarray()
    np.testing.assert_array_equal(found, [[0, 1, 0, 2], [0, 0, 1, 0]])
    from bench.quality.data import bbc

    encoded, key_mask = bbc.encode_bytes(["Señor go", "ok"], 12)
    assert counts.bytes_to_text(encoded, key_mask) == ["Señor go", "ok"]


def test_naive_bayes_chooses_its_smoothing_on_validation_and_predicts_test():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    ids = rng.integers(2, 10, (300, 20))
    ids[:, 0] = labels  # token 0 or 1 marks the class
    x = counts.token_counts(ids, 10)
    fitted = counts.naive_bayes((x[:200], labels[:200]), (x[200:250], labels[200:250]), x[250:])
    assert (fitted.predictions == labels[250:]).all()
    assert fitted.chosen["alpha"] in counts.NB_ALPHAS


def test_nearest_references_and_the_category_match_of_pairs():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 30)
    x = rng.normal(0, 0.1, (90, 5)) + y[:, None] * 3.0
    assert (counts.nearest_class_mean((x, y), x).predictions == y).all()
    fitted = counts.nearest_neighbours((x, y), (x, y), x[::-1])
    assert (fitted.predictions == y[::-1]).all() and fitted.chosen["k"] in counts.NEIGHBOURS
    docs = counts.token_counts(np.where(y[:, None] == 0, 1, 2) * np.ones((90, 6), int), 3)
    a, b = docs[:45], docs[45:]
    same = (y[:45] == y[45:]).astype(np.int64)
    found = counts.category_match((docs, y), (a, b, same), (a, b))
    # categories 1 and 2 share their words here, so only category 0 against the rest is known
    np.testing.assert_array_equal(found.predictions, ((y[:45] == 0) == (y[45:] == 0)).astype(int))


def test_translation_references():
    sources = ["in the beginning god created", "and the earth was without form", "let there be light"]
    targets = ["en el principio creo dios", "y la tierra estaba desordenada", "sea la luz y fue"]
    assert list(translation.nearest_source(sources, ["the earth was without form and void"])) == [1]
    assert translation.retrieved_translations(sources, targets, ["let there be light!"]) == [targets[2]]
    assert translation.corpus_bleu(targets, targets) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="hypotheses: 1 sentences for 3 references"):
        translation.corpus_bleu(["x"], targets)


def test_a_reference_scores_a_task_as_the_task_scores_a_model():
    """Recall's naive Bayes row has the overall accuracy and one per distance, and the
    overall one is the mean of the per-example hits."""
    settings = task_settings("recall", "tiny")
    rows = reference_rows("recall", "naive_bayes_tokens", settings.data, 0)
    conditions = {r["condition"] for r in rows}
    task = get_task("recall", settings.data, 0)
    task.prepare()
    distances = {f"distance={d}" for d in task.splits["test"]["distance"].unique().tolist()}
    assert conditions == {""} | distances
    assert all(r["split"] == "test" and r["status"] == "ok" and 0 <= r["value"] <= 1 for r in rows)
    assert "alpha" in json.loads(rows[0]["params"])


def test_which_references_apply_to_which_task():
    applies = {}
    for name in ("listops", "text", "retrieval", "image", "image_vit", "pathfinder", "bytelm",
                 "translate", "recall", "mqar", "selective_copy"):
        task = get_task(name, task_settings(name, "small").data, 0)  # data not loaded
        applies[name] = {r.name for r in list_references() if r.applies(task)}
    assert applies["text"] == {"naive_bayes_tokens", "naive_bayes_words"}
    assert applies["retrieval"] == {"category_match_tokens", "category_match_words"}
    assert applies["image"] == {"naive_bayes_tokens", "nearest_class_mean", "nearest_neighbours"}
    assert applies["image_vit"] == {"nearest_class_mean", "nearest_neighbours"}
    assert applies["bytelm"] == {"ngram_1", "ngram_2", "ngram_3", "ngram_4", "gzip", "xz"}
    assert applies["translate"] == {"copy_source", "nearest_training_pair"}
    assert applies["mqar"] == {"present_value"}  # per-token labels: no sequence classifier fits
    assert applies["selective_copy"] == set()
    assert applies["listops"] == applies["recall"] == applies["pathfinder"] == {"naive_bayes_tokens"}
    with pytest.raises(ValueError, match="references: unknown reference 'nope'"):
        get_reference("nope")


GRID = {"name": "refs", "kind": "quality", "preset": "tiny", "tasks": ["recall", "bytelm"],
        "variants": ["full", "causal", {"name": "full", "model": {"mixer": "lstm"},
                                        "role": "reference"}],
        "references": ["naive_bayes_tokens", "ngram_2"], "seeds": [0], "timeout_s": 300}


@pytest.mark.slow  # 25 s; a grid of references alone and every reference's own tests stay in the default run
def test_a_grid_computes_its_references_and_trains_a_decoder_once(tmp_path):
    config = parse_grid(GRID)
    todo = units(config, tmp_path)
    refs = [u for u in todo if isinstance(u, ReferenceUnit)]
    assert [(u.task, u.reference) for u in refs] == [("recall", "naive_bayes_tokens"),
                                                     ("bytelm", "ngram_2")]
    trained = [(u.spec["task"], u.label) for u in todo if not isinstance(u, ReferenceUnit)]
    assert ("bytelm", "causal") not in trained  # one model with full in a decoder
    assert ("recall", "causal") in trained and ("bytelm", "lstm (no attention)") in trained
    assert units(parse_grid(GRID, only=["full"]), tmp_path)[0].spec["variant"] == "full"
    rows = run_grid(config, tmp_path)
    df = load_quality(tmp_path)
    assert len(df) == len(rows) and (df.status == "ok").all()
    lstm = df[(df.label == "lstm (no attention)") & (df.split == "test")]
    assert set(lstm.role) == {"reference"} and set(lstm.attention_parts) == {"no attention (lstm layers)"}
    ngram = df[df.variant == "ngram_2"]
    assert list(ngram.value) == pytest.approx([rows[[r["variant"] for r in rows].index("ngram_2")]["value"]])
    text = build_quality_report(tmp_path)
    assert "| causal | " in text and "= full (one model in a decoder)" in text
    assert "## Past what needs no attention" in text and "## Parameters per model" in text
    # tiny models learn nothing: every task is moved out of the headline table, with why
    assert "## Tasks full attention has not learned at this budget" in text
    assert "(No task: full attention is past its strongest reference" in text
    from bench.quality.plots import plot_quality_run  # reference rows have no mask to reach

    assert {"pareto.png", "recall_distance.png"} <= {p.name for p in plot_quality_run(tmp_path)}
    assert run_grid(config, tmp_path) == []  # resumed: the references are done too
    # a data setting edited since: the reference of that task runs again, the other does not
    stale = df[df.variant == "ngram_2"].unit_id.iloc[0]
    recorded = [dict(r) for r in df.astype(object).where(df.notna(), "").to_dict("records")]
    for row in recorded:
        if row["unit_id"] == stale:
            row["settings"] = row["settings"].replace('"seq_len": ', '"seq_len": 9', 1)
    assert stale in superseded_units(recorded, config)
    assert not superseded_units([r for r in recorded if r["unit_id"] != stale], config)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"references": ["bigram"]}, "'references': unknown reference 'bigram'"),
    ({"references": 3}, "'references': must be 'all' or a list"),
    ({"variants": [], "references": []}, "'variants': must be a non-empty list"),
])
def test_bad_references_name_the_key(change, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_grid({**GRID, **change})


def test_a_grid_of_references_only_has_no_training_units(tmp_path):
    todo = units(parse_grid({**GRID, "variants": []}), tmp_path)
    assert todo and all(isinstance(u, ReferenceUnit) for u in todo)


def _top(rows: list[tuple[str, str, str, int, float]], metric: str = "accuracy") -> pd.DataFrame:
    return pd.DataFrame([{"task": t, "label": n, "role": r, "seed": s, "metric": metric, "value": v}
                         for t, n, r, s, v in rows])


def test_margins_against_the_strongest_reference():
    top = _top([("a", "nb", "reference", 0, 0.80), ("a", "lstm", "reference", 0, 0.70),
                ("a", "lstm", "reference", 1, 0.95),  # mean 0.825: the strongest
                *(("a", "full", "variant", s, v) for s, v in enumerate((0.90, 0.91, 0.92))),
                *(("a", "wide", "variant", s, v) for s, v in enumerate((0.70, 0.95, 0.86))),
                *(("a", "weak", "variant", s, v) for s, v in enumerate((0.5, 0.6, 0.7))),
                ("a", "one", "variant", 0, 0.9)])
    assert strongest_references(top).label.tolist() == ["lstm"]
    verdicts = {m.label: m.verdict for m in margins(top)}
    assert verdicts == {"full": CLEARS, "wide": SHORT, "weak": BELOW, "one": ONE_SEED}
    assert unlearned_tasks(top) == {}  # full attention clears task a
    weak_full = top.assign(label=top.label.replace({"full": "strong", "weak": "full"}))
    assert list(unlearned_tasks(weak_full)) == ["a"]
    lower = _top([("b", "xz", "reference", 0, 2.9), ("b", "ngram", "reference", 0, 2.4),
                  ("b", "full", "variant", 0, 2.5), ("b", "full", "variant", 1, 2.6)],
                 metric="bits_per_byte")
    (found,) = margins(lower)
    assert found.reference == "ngram" and found.margin == pytest.approx(-0.15) and found.verdict == BELOW


def test_the_cli_and_the_grid_import_without_the_tasks_extra():
    """`pip install -e .` (no extras) runs the quick sweep: scipy and scikit-learn, which only
    the references use, must not be imported when the CLI or a grid module is."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['scipy'] = sys.modules['sklearn'] = None; "
            "import bench.cli.app, bench.quality.grid, bench.quality.report, bench.quality.plots")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
