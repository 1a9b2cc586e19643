"""MQAR: the generator's layout and labels, the encoder's per-token logits, the task's metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality.data import mqar
from bench.quality.settings import task_settings
from bench.quality.tasks import get_task
from models import create_model


def _sample(n: int = 400, seed: int = 0, **kw):
    args = dict(seq_len=96, num_pairs=(2, 4, 8, 16), num_keys=24, num_values=12, num_fillers=6)
    args.update(kw)
    return mqar.generate(n, seed=seed, **args), mqar.Layout(args["num_keys"], args["num_values"],
                                                           args["num_fillers"])


def test_labels_are_the_values_written_after_the_queried_keys() -> None:
    out, layout = _sample()
    ids, labels, pairs, distance = out["ids"], out["labels"], out["num_pairs"], out["distance"]
    assert ids.shape == labels.shape == distance.shape == (400, 96) and ids.dtype == np.int64
    assert ids.min() >= layout.key_base and ids.max() < layout.vocab_size  # no padding id 0
    is_key = (ids >= layout.key_base) & (ids < layout.value_base)
    for row in range(len(ids)):
        p = int(pairs[row])
        keys, values = ids[row, 0:2 * p:2], ids[row, 1:2 * p:2]
        assert np.all((keys >= layout.key_base) & (keys < layout.value_base))
        assert np.all((values >= layout.value_base) & (values < layout.filler_base))
        assert len(set(keys.tolist())) == p  # distinct keys
        query = np.flatnonzero(labels[row] != mqar.IGNORE)
        assert query.size == p and np.all(query >= 2 * p)  # every key queried once, after the pairs
        assert np.array_equal(np.flatnonzero(distance[row] >= 0), query)
        assert sorted(ids[row, query].tolist()) == sorted(keys.tolist())
        assert np.flatnonzero(is_key[row, 2 * p:]).size == p  # no other key token after the pairs
        for q in query:
            (slot,) = np.flatnonzero(keys == ids[row, q])
            assert labels[row, q] == values[slot] - layout.value_base  # the value bound to that key
            assert distance[row, q] == q - 2 * slot >= 1
        assert np.all(labels[row, labels[row] != mqar.IGNORE] < 12)
    assert np.all(labels[distance < 0] == mqar.IGNORE)


def test_pair_counts_are_balanced_and_distances_short_and_long() -> None:
    out, _ = _sample(n=402)
    counts = np.unique(out["num_pairs"], return_counts=True)
    assert counts[0].tolist() == [2, 4, 8, 16] and sorted(counts[1].tolist()) == [100, 100, 101, 101]
    query = out["labels"] != mqar.IGNORE
    d = out["distance"][query]
    assert (d <= 8).mean() > 0.1 and (d > 48).mean() > 0.1  # short and long distances both occur
    gap = np.nonzero(query)[1] - 2 * np.repeat(out["num_pairs"], out["num_pairs"])  # after the pairs
    assert gap.min() == 0 and (gap < 8).mean() > 3 * ((gap >= 32) & (gap < 40)).mean()  # ~1 / (gap + 1)


def test_same_seed_same_data_and_other_seed_other_data() -> None:
    a, _ = _sample(n=50, seed=3)
    b, _ = _sample(n=50, seed=3)
    c, _ = _sample(n=50, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["ids"], c["ids"])
    assert mqar.generate(0, seq_len=12, num_pairs=(2,), seed=0)["ids"].shape == (0, 12)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(num_pairs=()), r"^num_pairs: must not be empty$"),
    (dict(num_pairs=(4, 0)), r"^num_pairs: must be an integer >= 1 or a list of them; got 0$"),
    (dict(num_pairs=(8,), num_keys=4), r"^num_pairs: must be at most num_keys=4 \(each pair needs"),
    (dict(num_pairs=(8,), seq_len=20),
     r"^seq_len: must be at least 24 \(2 per pair plus 1 per query for num_pairs=8\); got 20$"),
    (dict(num_values=0), r"^num_values: must be"),
])
def test_argument_errors(kwargs, message) -> None:
    args = dict(seq_len=64, num_pairs=(2,), num_keys=16, num_values=8, num_fillers=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mqar.generate(5, seed=0, **args)


@pytest.mark.parametrize("num_extra_global", [0, 3])
def test_tokens_pooling_gives_logits_of_the_input_tokens_only(num_extra_global) -> None:
    torch.manual_seed(0)
    model = create_model("encoder_classifier", "mini", pooling="tokens", num_classes=5,
                         num_extra_global=num_extra_global).eval()
    assert model.prefix.count == num_extra_global  # no CLS
    ids = torch.randint(1, 32, (2, 10))
    logits = model(ids)
    assert logits.shape == (2, 10, 5)
    with torch.no_grad():
        h, _ = model.encode(ids)  # (B, G + N, D)
        assert torch.allclose(logits, model.head(h[:, num_extra_global:]))
        # each position's logits follow its own token: change the last token, the last row moves most
        other = ids.clone()
        other[:, -1] = (other[:, -1] % 30) + 1
        assert not torch.allclose(model(other)[:, -1], logits[:, -1])


def test_tokens_pooling_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ValueError, match=r"^pooling: 'tokens' gives logits per position"):
        create_model("encoder_classifier", "mini", pooling="tokens", dual=True)
    with pytest.raises(ValueError, match=r"^pooling: unknown value 'tokens'"):
        create_model("vit", "mini", pooling="tokens")


def test_task_trains_on_query_positions_and_reports_conditions() -> None:
    settings = task_settings("mqar", "tiny")
    task = get_task("mqar", settings.data, seed=0)
    task.prepare()
    assert task.model_overrides()["pooling"] == "tokens" and task.num_classes == 8
    torch.manual_seed(0)
    model = create_model("encoder_classifier", "mini", attention="full",
                         **{**task.model_overrides(), **settings.model})
    batch = task.train_batch(0, 4)
    loss, tokens = task.loss(model, batch)
    assert tokens == 4 * task.seq_len and torch.isfinite(loss)
    # the loss reads query positions only: changing a non-query label changes nothing
    changed = dict(batch, labels=batch["labels"].clone())
    changed["labels"][batch["labels"] == -100] = 0
    assert not torch.isclose(task.loss(model, changed)[0], loss)
    assert torch.isclose(task.loss(model, dict(batch))[0], loss)
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model, "test", limit=None, batch_size=8, final=True)
        q, _, _ = task.query_predictions(model, "test", None, 8)
    rows = {(m.name, m.condition): m.value for m in metrics}
    expected = {("accuracy", ""), ("majority_accuracy", ""), ("accuracy", "num_pairs=2"),
                ("accuracy", "num_pairs=4"), ("accuracy", "distance<=8"),
                ("accuracy", "distance<=16"), ("accuracy", "distance<=47")}
    assert set(rows) == expected
    assert rows[("accuracy", "")] == pytest.approx(float((q["pred"] == q["label"]).float().mean()))
    assert len(q["label"]) == int(task.splits["test"]["num_pairs"].sum())  # one per query
    far = q["distance"] > 16
    assert rows[("accuracy", "distance<=47")] == pytest.approx(
        float((q["pred"][far] == q["label"][far]).float().mean()))
    labels = task.splits["test"]["labels"]
    common = int(torch.bincount(task.splits["train"]["labels"][task.splits["train"]["labels"] >= 0]).argmax())
    assert rows[("majority_accuracy", "")] == pytest.approx(float((labels[labels >= 0] == common).float().mean()))
    assert task.evaluate(model, "val", limit=4, batch_size=8, final=False)[0].condition == ""


def test_decoder_reader_scores_the_value_logits_of_a_causal_language_model() -> None:
    settings = task_settings("mqar", "tiny")
    task = get_task("mqar", {**settings.data, "reader": "decoder"}, seed=0)
    task.prepare()
    assert task.model_kind == "decoder_lm" and task.causal_self_attention
    assert task.model_overrides() == {"vocab_size": task.vocab_size, "max_len": task.seq_len + 8}
    torch.manual_seed(0)
    model = create_model("decoder_lm", "mini", attention="full", **task.model_overrides()).eval()
    batch = {k: v[:3] for k, v in task.splits["test"].items()}
    base = mqar.Layout(8, 8, 4).value_base
    with torch.no_grad():
        logits = task.logits(model, batch)  # (B, N, C)
        full = model(batch["ids"])  # (B, N, V)
        assert logits.shape == (3, task.seq_len, task.num_classes)
        assert torch.equal(logits, full[..., base:base + task.num_classes])
        # causal: a query's answer reads nothing after it (changing the last token moves no
        # earlier position's logits)
        other = batch["ids"].clone()
        other[:, -1] = base
        assert torch.allclose(task.logits(model, dict(batch, ids=other))[:, :-1], logits[:, :-1])
    loss, tokens = task.loss(model, task.train_batch(0, 4))
    assert torch.isfinite(loss) and tokens == 4 * task.seq_len


def test_reader_is_checked_and_the_encoder_stays_the_default() -> None:
    settings = task_settings("mqar", "tiny")
    assert get_task("mqar", settings.data, seed=0).model_kind == "encoder_classifier"
    with pytest.raises(ValueError, match=r"^reader: unknown value 'lstm'; allowed values are "
                                         r"\['encoder', 'decoder'\]$"):
        _ = get_task("mqar", {**settings.data, "reader": "lstm"}, seed=0).model_kind


def test_present_value_reference_is_the_expected_accuracy_of_guessing_a_written_value() -> None:
    from bench.quality.reference import get_reference

    settings = task_settings("mqar", "tiny")
    task = get_task("mqar", settings.data, seed=0)
    task.prepare()
    rows = {(m.name, m.condition): m.value for m in get_reference("present_value").compute(task).metrics}
    # by hand: per query, the share of the sequence's P written values equal to its answer
    data, layout = task.splits["test"], mqar.Layout(8, 8, 4)
    expected, by_pairs = [], {}
    for ids, labels, p in zip(data["ids"].tolist(), data["labels"].tolist(), data["num_pairs"].tolist()):
        values = [ids[2 * i + 1] - layout.value_base for i in range(p)]
        for label in labels:
            if label != mqar.IGNORE:
                expected.append(values.count(label) / p)
                by_pairs.setdefault(p, []).append(values.count(label) / p)
    assert rows[("accuracy", "")] == pytest.approx(np.mean(expected))
    for p, hits in by_pairs.items():
        assert rows[("accuracy", f"num_pairs={p}")] == pytest.approx(np.mean(hits))
    assert rows[("accuracy", "num_pairs=2")] > rows[("accuracy", "num_pairs=4")]  # about 1 / P
    assert {c for _, c in rows} >= {"distance<=8", "distance<=16"}
