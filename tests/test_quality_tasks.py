"""Every quality task on its real data (tiny preset): fixed seeded splits, a model that
trains on its batches, the headline metric, and splits that never share test material."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality.settings import task_settings
from bench.quality.tasks import get_task, list_tasks

HEADLINE = {"bytelm": "bits_per_byte", "translate": "loss"}  # the rest: accuracy


@pytest.fixture(scope="module", params=list_tasks())
def prepared(request):
    settings = task_settings(request.param, "tiny")
    task = get_task(request.param, settings.data, seed=0)
    task.prepare()
    return task, settings


def _model(task, settings):
    from models import create_model

    torch.manual_seed(0)
    return create_model(task.model_kind, "mini", attention="sliding_window",
                        attention_params={"window": 4}, **{**task.model_overrides(), **settings.model})


def test_splits_batches_loss_and_metric(prepared):
    task, settings = prepared
    assert set(task.splits) == {"train", "val", "test"}
    assert task.seq_len >= 4 * 4  # at least 4 windows of the tiny preset
    first, again = task.train_batch(3, 4), task.train_batch(3, 4)
    assert all(torch.equal(first[k], again[k]) for k in first)  # a pure function of (seed, step)
    other = task.train_batch(4, 4)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    model = _model(task, settings)
    loss, tokens = task.loss(model, first)
    loss.backward()
    assert torch.isfinite(loss) and tokens > 0
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model, "val", limit=8, batch_size=4, final=False)
    name = HEADLINE.get(task.name, "accuracy")
    (headline,) = [m for m in metrics if m.name == name and not m.condition]
    assert np.isfinite(headline.value) and headline.tokens > 0


def test_the_same_data_seed_gives_the_same_splits(prepared):
    task, settings = prepared
    again = get_task(task.name, settings.data, seed=5)  # another training seed, same data
    again.prepare()
    for split in ("train", "val", "test"):
        for key, value in task.splits[split].items():
            assert torch.equal(value, again.splits[split][key]), (split, key)


def test_classification_labels_and_chance(prepared):
    task, _ = prepared
    if "labels" not in task.splits["train"]:
        pytest.skip(f"{task.name} is not a classification task")
    labels = torch.cat([task.splits[s]["labels"].flatten() for s in ("train", "val", "test")])
    labels = labels[labels != -100]  # mqar labels every position, -100 where nothing is asked
    assert 0 <= int(labels.min()) and int(labels.max()) < task.num_classes
    chance = task.majority_accuracy("test", task.num_examples("test"))
    assert 0 < chance.value < 1


def test_image_test_examples_come_from_the_test_images_only():
    from bench.quality.data import fashion_mnist

    settings = task_settings("image", "tiny")
    task = get_task("image", settings.data, seed=0)
    task.prepare()
    test_images, _ = fashion_mnist.load("test")
    test_rows = {bytes(row) for row in test_images.reshape(len(test_images), -1).astype(np.uint8)}
    ours = task.splits["test"]["ids"].numpy().astype(np.uint8)
    assert all(bytes(row) in test_rows for row in ours)
    train_images, _ = fashion_mnist.load("train")
    train_rows = {bytes(r) for r in task.splits["train"]["ids"].numpy().astype(np.uint8)}
    val_rows = {bytes(r) for r in task.splits["val"]["ids"].numpy().astype(np.uint8)}
    assert not train_rows & val_rows and len(train_images) == 60000


def test_translation_chapters_never_straddle_splits():
    settings = task_settings("translate", "tiny")
    task = get_task("translate", settings.data, seed=0)
    task.prepare()
    chapters = {split: {ref.rsplit(":", 1)[0] for ref in refs}
                for split, refs in task.verse_refs.items()}
    assert not chapters["train"] & chapters["test"] and not chapters["val"] & chapters["test"]
    assert not chapters["train"] & chapters["val"]
    assert all("¶" not in text for text in task.references["test"])


def test_recall_reports_accuracy_per_distance():
    settings = task_settings("recall", "tiny")
    task = get_task("recall", settings.data, seed=0)
    task.prepare()
    model = _model(task, settings).eval()
    with torch.no_grad():
        metrics = task.evaluate(model, "test", limit=None, batch_size=8, final=True)
    conditions = {m.condition for m in metrics if m.name == "accuracy"}
    assert conditions == {"", *(f"distance={d}" for d in settings.data["distances"])}


def _input_rows(split: dict[str, torch.Tensor]) -> set[bytes]:
    inputs = split["ids"] if "ids" in split else split["images"]
    rows = inputs.reshape(len(inputs), -1).numpy()
    if "pair_ids" in split:  # a retrieval pair: either side may be a seen article
        rows = np.concatenate([rows, split["pair_ids"].numpy()])
    return {row.tobytes() for row in rows}


def test_no_test_input_is_also_a_training_input(prepared):
    task, _ = prepared
    train = getattr(task, "articles", None) or task.splits["train"]  # retrieval: the articles
    if "ids" not in train and "images" not in train:
        pytest.skip(f"{task.name} is split by position or by chapter (tested on its own)")
    seen = _input_rows(train)
    for split in ("val", "test"):
        assert not _input_rows(task.splits[split]) & seen, split
