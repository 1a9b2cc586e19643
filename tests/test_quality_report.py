"""The quality report's floors, control rows and paired significance, on synthetic rows (no
training): known differences give known intervals and verdicts."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench.engine.results import ResultsWriter
from bench.engine.row_schema import QUALITY_COLUMNS
from bench.quality.data.errors import DataMissingError
from bench.quality.grid import QUALITY_FILE
from bench.quality.report import build_quality_report, load_quality
from bench.quality.settings import task_settings
from bench.quality.significance import (
    BETTER,
    NOISE,
    ONE_SEED,
    WORSE,
    differences_from_reference,
    paired_difference,
    t_quantile_975,
)
from bench.quality.tables import MAJORITY, UNIFORM, quality_table, significance_table, uniform_chance
from bench.quality.tasks import ClassificationTask, get_task, list_tasks

RECALL = task_settings("recall", "tiny")  # num_values in its data: 1 / classes is known


def _rows(task: str, variant: str, values: dict[int, float], *, metric: str = "accuracy",
          params: str = "{}", role: str = "", overrides: str = "", title: str = "") -> list[dict]:
    settings = RECALL.to_json() if task == "recall" else json.dumps({"data": {}})
    return [{"unit_id": f"{task}-{variant}-{overrides}-{seed}", "task": task, "variant": variant,
             "label": "stale label", "params": params, "seed": seed, "preset": "tiny",
             "split": "test", "metric": metric, "condition": "", "value": value,
             "status": "ok", "settings": settings, "role": role, "title": title,
             "overrides": overrides, "train_tokens_per_s": 1000.0,
             "timestamp": "2026-01-01T00:00:00+00:00"}
            for seed, value in values.items()]


FULL = {0: 0.30, 1: 0.60, 2: 0.90}  # seeds differ a lot: only pairing by seed sees a +0.05


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=QUALITY_COLUMNS)
    for col in ("condition", "reason", "kernel_path", "attention_parts", "title", "overrides"):
        df[col] = df[col].astype(object).fillna("")
    df["role"] = df.role.fillna("").replace("", "variant")
    df["label"] = [r.variant + (" [position=none]" if r.overrides else "")
                   for r in df.itertuples()]
    return df


@pytest.fixture
def quality() -> pd.DataFrame:
    rows = [*_rows("recall", "full", FULL),
            # +0.05 on every seed, listed out of seed order: paired, the spread is 0
            *_rows("recall", "causal", {2: 0.95, 0: 0.35, 1: 0.65}),
            # -0.10, -0.12, -0.08: mean -0.10, sd 0.02
            *_rows("recall", "sliding_window", {0: 0.20, 1: 0.48, 2: 0.82}),
            # +0.02, -0.03, +0.01: the interval holds 0
            *_rows("recall", "dilated", {0: 0.32, 1: 0.57, 2: 0.91}),
            # only seed 1 shared with full (seed 7 has no partner)
            *_rows("recall", "nystrom", {1: 0.70, 7: 0.10}),
            *_rows("recall", "full", {0: 0.10, 1: 0.41, 2: 0.69}, role="control",
                   overrides=json.dumps({"model": {"position": "none"}}), title="order-blind"),
            # bits per byte: lower is better; -0.2, -0.21, -0.19
            *_rows("bytelm", "full", {0: 4.0, 1: 4.1, 2: 3.9}, metric="bits_per_byte"),
            *_rows("bytelm", "causal", {0: 3.8, 1: 3.89, 2: 3.71}, metric="bits_per_byte"),
            {**_rows("recall", "full", {0: 0.116})[0], "metric": "majority_accuracy",
             "unit_id": "m"}]
    return _frame(rows)


def test_the_t_quantile_matches_the_t_distribution():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 121):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3), df
    with pytest.raises(ValueError, match="df: must be >= 1"):
        t_quantile_975(0)


def test_a_paired_difference_gives_the_t_interval_and_its_verdict():
    diff = paired_difference([-0.10, -0.12, -0.08])
    half = 4.303 * 0.02 / math.sqrt(3)
    assert diff.n == 3 and diff.mean == pytest.approx(-0.10)
    assert (diff.low, diff.high) == (pytest.approx(-0.10 - half), pytest.approx(-0.10 + half))
    assert diff.verdict == WORSE
    assert paired_difference([-0.10, -0.12, -0.08], higher_is_better=False).verdict == BETTER
    assert paired_difference([0.02, -0.03, 0.01]).verdict == NOISE
    assert paired_difference([0.0, 0.0]).verdict == NOISE  # a zero interval holds 0
    single = paired_difference([0.3])
    assert single.verdict == ONE_SEED and single.low is None and single.mean == 0.3


def test_differences_are_paired_by_seed_against_full(quality):
    from bench.quality.tables import headline

    found = differences_from_reference(headline(quality)).set_index(["task", "label"])
    causal = found.loc[("recall", "causal")]
    # unpaired, the seeds' spread (sd 0.3) would swamp +0.05; paired, every seed says +0.05
    assert causal.n == 3 and causal["mean"] == pytest.approx(0.05)
    assert causal.low == pytest.approx(0.05) and causal.verdict == BETTER
    window = found.loc[("recall", "sliding_window")]
    half = 4.303 * 0.02 / math.sqrt(3)
    assert window["mean"] == pytest.approx(-0.10) and window.high == pytest.approx(-0.10 + half)
    assert window.verdict == WORSE
    assert found.loc[("recall", "dilated")].verdict == NOISE
    nystrom = found.loc[("recall", "nystrom")]
    assert nystrom.n == 1 and nystrom.verdict == ONE_SEED and nystrom["mean"] == pytest.approx(0.1)
    assert found.loc[("recall", "full [position=none]")].verdict == WORSE
    lm = found.loc[("bytelm", "causal")]  # lower bits per byte: better
    assert lm["mean"] == pytest.approx(-0.2) and lm.verdict == BETTER
    assert ("recall", "full") not in found.index


def test_the_table_marks_cells_beyond_seed_noise_and_ends_with_the_floors(quality):
    table = quality_table(quality).set_index("variant")
    assert table.loc["causal", "recall"].endswith("▲")
    assert table.loc["sliding_window", "recall"].endswith("▼")
    assert table.loc["causal", "bytelm"].endswith("▲")  # lower bits per byte
    assert not table.loc["dilated", "recall"].endswith(("▲", "▼"))
    assert not table.loc["nystrom", "recall"].endswith(("▲", "▼"))  # one shared seed
    names = list(table.index)
    separator = names.index("**floors and controls**")
    control = "full [position=none] (control: order-blind)"
    # variants above the separator, the control and the floors below it
    assert set(names[:separator]) == {"full", "causal", "sliding_window", "dilated", "nystrom"}
    assert names[separator + 1:] == [control, UNIFORM, MAJORITY]
    assert table.loc[UNIFORM, "recall"] == f"{100 / RECALL.data['num_values']:.1f}"
    assert table.loc[MAJORITY, "recall"] == "11.6"
    assert table.loc[UNIFORM, "bytelm"] == "-"  # no classes: no uniform chance


def test_uniform_chance_comes_from_the_task_settings_without_data():
    rows = [*_rows("recall", "full", {0: 0.5}),
            {**_rows("listops", "full", {0: 0.3})[0],
             "settings": task_settings("listops", "tiny").to_json()}]
    chance = uniform_chance(_frame(rows))
    assert chance == {"recall": pytest.approx(1 / RECALL.data["num_values"]),
                      "listops": pytest.approx(0.1)}


@pytest.mark.parametrize("task", [t for t in list_tasks()
                                  if isinstance(get_task(t, task_settings(t, "tiny").data, 0), ClassificationTask)])
def test_every_classification_task_knows_its_classes_before_its_data(task):
    """Uniform chance is read from a task built but not prepared (no data loaded): its
    number of classes must be the one its data gives (mqar said 2 until prepared: 50%)."""
    built = get_task(task, task_settings(task, "tiny").data, 0)
    before = built.num_classes
    try:
        built.prepare()
    except DataMissingError as err:
        pytest.skip(f"{task}: its data is not installed here ({err})")
    assert before == built.num_classes > 1


def test_the_significance_table_says_points_and_verdicts(quality):
    table = significance_table(quality).set_index(["task", "variant"])
    window = table.loc[("recall", "sliding_window")]
    assert window["difference"] == "-10.0" and window["verdict"] == WORSE
    assert window["95% interval"] == f"[{-10 - 100 * 4.303 * 0.02 / math.sqrt(3):+.1f}, " \
                                     f"{-10 + 100 * 4.303 * 0.02 / math.sqrt(3):+.1f}]"
    assert table.loc[("recall", "nystrom"), "95% interval"] == "-"
    assert table.loc[("bytelm", "causal"), "difference"] == "-0.200"


def test_the_report_of_a_run_directory_relabels_old_rows_and_reads_files_without_roles(
        tmp_path, quality):
    old_columns = QUALITY_COLUMNS[:QUALITY_COLUMNS.index("role")]  # a file from before roles
    rows = [{k: v for k, v in r.items() if k in old_columns}
            for r in quality.to_dict("records") if r["role"] == "variant"]
    rows += [{**rows[0], "unit_id": "d", "variant": "dilated", "params": '{"window": 16}'}]
    ResultsWriter(tmp_path, rows, QUALITY_FILE, old_columns)
    df = load_quality(tmp_path)
    assert (df.role == "variant").all() and (df.overrides == "").all()
    # the stored label ("stale label") gives way to today's, defaults included
    assert set(df.label) == {"full", "causal", "sliding_window(window=128)",
                             "dilated(dilation=2, window=16)", "dilated(dilation=2, window=64)",
                             "nystrom(num_landmarks=64, pinv_iters=6)"}
    text = build_quality_report(tmp_path)
    assert "## Difference from full attention (paired by seed)" in text
    assert f"| {UNIFORM} |" in text and f"| {MAJORITY} |" in text


def test_the_average_is_only_given_over_every_accuracy_task(quality):
    # a second accuracy task that only full attention ran: the others' averages would be over
    # recall alone and would not compare with full attention's
    rows = _rows("image", "full", {0: 0.5})
    table = quality_table(pd.concat([quality, _frame(rows)], ignore_index=True)).set_index("variant")
    assert table.loc["full", "avg (accuracy tasks)"] == f"{(60.0 + 50.0) / 2:.1f}"
    assert table.loc["causal", "avg (accuracy tasks)"] == "- (1 of 2 tasks)"


def test_one_rule_tells_rows_of_computed_references_from_trained_rows(quality):
    """A computed reference's row has role reference and a reference's name; a trained entry
    with role reference (the LSTM model) and a trained variant that happens to bear a
    reference's name (a plug-in ``gzip``) are trained rows: seeds, differences, averages."""
    from bench.quality.grid import is_reference_row
    from bench.quality.reference_unit import reference_row_mask
    from bench.quality.tables import trained

    lstm = json.dumps({"model": {"mixer": "lstm"}})
    rows = [*_rows("recall", "naive_bayes_tokens", {0: 0.40}, role="reference",
                   title="naive Bayes (token counts)"),
            *_rows("recall", "full", {0: 0.25, 1: 0.50, 2: 0.80}, role="reference",
                   overrides=lstm, title="lstm (no attention)"),
            *_rows("recall", "gzip", {0: 0.31, 1: 0.62, 2: 0.93})]
    extra = _frame(rows)
    extra["label"] = ["naive Bayes (token counts)"] + ["lstm (no attention)"] * 3 + ["gzip"] * 3
    df = pd.concat([quality, extra], ignore_index=True)
    mask = reference_row_mask(df)
    assert list(mask) == [is_reference_row(r) for r in df.to_dict("records")]
    assert set(df[mask].label) == {"naive Bayes (token counts)"}
    assert {"lstm (no attention)", "gzip"} <= set(trained(df).label)
    differences = significance_table(df).set_index(["task", "variant"])
    assert ("recall", "gzip") in differences.index
    table = quality_table(df).set_index("variant")
    assert table.loc["gzip", "avg (accuracy tasks)"] == "62.0"
    assert table.loc["naive Bayes (token counts) (reference)", "avg (accuracy tasks)"] == "-"


def test_the_report_computes_the_headline_rows_and_the_margins_once(tmp_path, quality, monkeypatch):
    """Every table of the report reads the same headline rows and margins: computed once
    (the grid's rows, then the matched-compute rows apart), not once per table."""
    import bench.quality.margins as margins_module
    import bench.quality.report as report_module
    import bench.quality.tables as tables_module

    calls = {"headline": 0, "margins": 0}

    def counting(name: str, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    headline, margins = tables_module.headline, margins_module.margins
    for module in (report_module, tables_module):
        monkeypatch.setattr(module, "headline", counting("headline", headline))
    for module in (margins_module, tables_module, report_module):
        monkeypatch.setattr(module, "margins", counting("margins", margins), raising=False)
    rows = [r for r in quality.to_dict("records")]
    rows += _rows("recall", "naive_bayes_tokens", {0: 0.40}, role="reference")
    ResultsWriter(tmp_path, rows, QUALITY_FILE, QUALITY_COLUMNS)
    text = build_quality_report(tmp_path)
    assert "## Past what needs no attention" in text
    assert calls == {"headline": 2, "margins": 1}  # the headline: the grid's rows, the budget's


def test_a_grid_of_references_only_takes_the_majority_class_from_the_task_data():
    """No trained row carries ``majority_accuracy``: the floor comes from the task's data,
    built from the rows' data settings, the same level a trained model's evaluation records."""
    from bench.quality.tasks import get_task

    rows = _rows("recall", "naive_bayes_tokens", {0: 0.40}, role="reference",
                 title="naive Bayes (token counts)")
    rows += [{**rows[0], "unit_id": "b", "task": "bytelm", "variant": "ngram_2",
              "metric": "bits_per_byte", "value": 3.2,
              "settings": task_settings("bytelm", "tiny").to_json()}]
    table = quality_table(_frame(rows)).set_index("variant")
    task = get_task("recall", RECALL.data, 0)
    task.prepare()
    expected = task.majority_accuracy("test", task.num_examples("test")).value
    assert table.loc[MAJORITY, "recall"] == f"{expected * 100:.1f}"
    assert table.loc[MAJORITY, "bytelm"] == "-"  # no classes
    # a trained row's recorded level is what the table shows where there is one
    trained_row = {**rows[0], "unit_id": "t", "variant": "full", "role": "variant",
                   "metric": "majority_accuracy", "value": 0.5}
    table = quality_table(_frame([*rows, trained_row])).set_index("variant")
    assert table.loc[MAJORITY, "recall"] == "50.0"


def test_causal_alone_trains_on_a_decoder_once_as_causal_and_the_table_says_it_is_full(tmp_path):
    """``--variant causal`` without full: the decoder task trains once, under the label asked
    for, and its cell says it is full attention's model; with full, the grid trains full only."""
    from bench.quality.grid_config import parse_grid
    from bench.quality.tables import SAME_AS_FULL
    from bench.quality.units import units

    grid = {"name": "g", "kind": "quality", "preset": "tiny", "tasks": ["recall", "bytelm"],
            "variants": ["full", "causal"], "seeds": [0]}
    alone = [(u.spec["task"], u.label) for u in units(parse_grid(grid, only=["causal"]), tmp_path)]
    assert alone == [("recall", "causal"), ("bytelm", "causal")]
    both = [(u.spec["task"], u.label) for u in units(parse_grid(grid), tmp_path)]
    assert ("bytelm", "causal") not in both and ("bytelm", "full") in both

    def lm(variant: str, values: dict[int, float]) -> list[dict]:
        rows = _rows("bytelm", variant, values, metric="bits_per_byte")
        return [{**r, "model_kind": "decoder_lm"} for r in rows]

    causal = _frame([*_rows("recall", "causal", {0: 0.5}), *lm("causal", {0: 4.0})])
    table = quality_table(causal).set_index("variant")
    assert table.loc["causal", "bytelm"] == f"4.000 {SAME_AS_FULL}"
    assert table.loc["causal", "recall"] == "50.0"  # an encoder: a model of its own
    # with full trained (the whole grid), causal has no rows of its own on the decoder task
    whole = _frame([*lm("full", {0: 4.0}), *_rows("recall", "causal", {0: 0.5})])
    assert quality_table(whole).set_index("variant").loc["causal", "bytelm"] == \
        "= full (one model in a decoder)"
