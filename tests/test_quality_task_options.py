"""Task and model options the presets use: the MLP head, pooled image pixels, Pathfinder's
binary patch codes and in-batch retrieval training, each against a direct reference."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.engine.config import ConfigError
from bench.quality.settings import task_settings
from bench.quality.tasks import get_task, list_tasks, task_info
from bench.quality.tasks.base import GeneratedTask
from bench.quality.tasks.image import downsample
from bench.quality.tasks.pathfinder import patch_codes
from models import create_model


def test_head_hidden_gives_an_mlp_head_and_rejects_a_negative_width():
    model = create_model("encoder_classifier", "mini", num_classes=3, head_hidden=24)
    assert [type(m) for m in model.head] == [torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear]
    assert model.head[0].out_features == 24
    assert model(torch.randint(0, 32, (2, 10))).shape == (2, 3)
    assert isinstance(create_model("encoder_classifier", "mini").head, torch.nn.Linear)
    with pytest.raises(ValueError, match="head_hidden"):
        create_model("encoder_classifier", "mini", head_hidden=-1)


def test_downsample_averages_blocks_and_rounds():
    images = np.arange(2 * 28 * 28, dtype=np.float64).reshape(2, 28, 28) % 251
    images = images.astype(np.uint8)
    pooled = downsample(images, 2)
    assert pooled.shape == (2, 14, 14) and pooled.dtype == np.uint8
    block = images[1, 6:8, 10:12].astype(np.float64)
    assert pooled[1, 3, 5] == np.rint(block.mean())
    assert downsample(images, 1) is images


def test_image_task_with_downsample_has_a_quarter_of_the_tokens():
    data = {**task_settings("image", "tiny").data, "downsample": 2}
    task = get_task("image", data, seed=0)
    task.prepare()
    assert task.seq_len == 196 and task.splits["train"]["ids"].shape[1] == 196


def test_patch_codes_number_lit_pixels_row_major():
    image = np.zeros((1, 4, 4), dtype=np.uint8)
    image[0, 0, 1] = 255  # block (0, 0), pixel 1 -> bit 1
    image[0, 1, 0] = 200  # block (0, 0), pixel 2 -> bit 2
    image[0, 3, 3] = 255  # block (1, 1), pixel 3 -> bit 3
    image[0, 2, 1] = 100  # not lit (<= 127)
    assert patch_codes(image, 2).tolist() == [[0b0110, 0, 0, 0b1000]]


def test_in_batch_retrieval_trains_on_train_articles_with_a_class_balanced_loss():
    settings = task_settings("retrieval", "tiny")
    task = get_task("retrieval", {**settings.data, "train_pairing": "in_batch"}, seed=0)
    task.prepare()
    batch = task.train_batch(0, 6)
    train_ids = {tuple(row.tolist()) for row in task.articles["ids"]}
    assert all(tuple(row.tolist()) in train_ids for row in batch["ids"])  # no val/test article
    for split in ("val", "test"):
        held_out = {tuple(r.tolist()) for r in task.splits[split]["ids"]}
        assert not held_out & train_ids
    torch.manual_seed(0)
    model = create_model("encoder_classifier", "mini", **{**task.model_overrides(),
                                                          **settings.model})
    loss, tokens = task.loss(model, batch)
    u = model.embed(batch["ids"], batch["key_mask"])
    terms = {0: [], 1: []}
    for i in range(6):
        for j in range(i + 1, 6):
            same = int(batch["category"][i] == batch["category"][j])
            logits = model.head(torch.cat([u[i], u[j], u[i] * u[j], u[i] - u[j]]))
            terms[same].append(F.cross_entropy(logits[None], torch.tensor([same])))
    expected = sum(0.5 * torch.stack(t).mean() for t in terms.values() if t)
    torch.testing.assert_close(loss, expected)
    assert tokens == int(batch["key_mask"].sum())
    with pytest.raises(ValueError, match="train_pairing"):
        get_task("retrieval", {**settings.data, "train_pairing": "all"}, seed=0).prepare()


def test_retrieval_crops_read_a_window_of_the_article_text_at_a_per_step_offset():
    from bench.quality.data import bbc

    settings = task_settings("retrieval", "tiny")
    data = {**settings.data, "train_pairing": "in_batch", "train_crop_from": 256}
    task = get_task("retrieval", data, seed=0)
    task.prepare()
    texts, _ = bbc.load_articles()
    articles = [bytes((row[row > 0] - 1).tolist()) for row in bbc.encode_bytes(texts, 256)[0]]
    batch = task.train_batch(3, 8)
    starts = []
    for ids, mask in zip(batch["ids"], batch["key_mask"]):
        window = bytes((ids[mask] - 1).tolist())
        assert len(window) == 32
        found = [a.find(window) for a in articles if a.find(window) >= 0]
        assert found  # a real 32-byte window of an article's first 256 bytes
        starts.append(min(found))
    assert max(starts) > 0  # not always the first bytes
    assert torch.equal(task.train_batch(3, 8)["ids"], batch["ids"])  # a pure function of (seed, step)
    assert not torch.equal(task.train_batch(4, 8)["ids"], batch["ids"])
    assert task.splits["test"]["ids"].shape[1] == 32
    for bad in (16, "long"):
        with pytest.raises(ValueError, match="train_crop_from"):
            get_task("retrieval", {**data, "train_crop_from": bad}, seed=0).prepare()


def test_pathfinder_patches_input_feeds_the_vit_the_image_it_generated():
    from bench.quality.data import pathfinder

    data = {**task_settings("pathfinder", "tiny").data, "input": "patches", "patch_size": 4}
    task = get_task("pathfinder", data, seed=0)
    task.prepare()
    assert task.model_kind == "vit" and task.seq_len == (16 // 4) ** 2
    images, labels = pathfinder.load_or_generate(data["examples"], seed=0, size=16)
    train = task.splits["train"]
    assert train["images"].shape[1:] == (1, 16, 16)
    first = train["images"][0, 0].numpy() * 255
    match = np.flatnonzero(np.abs(images.astype(np.float32) - first).reshape(len(images), -1)
                            .max(axis=1) < 0.5)
    assert len(match) >= 1 and labels[match[0]] == int(train["labels"][0])
    model = create_model("vit", "mini", **{**task.model_overrides(), "num_layers": 1})
    assert model.config.patch_size == 4 and model.config.in_channels == 1
    assert task.logits(model, {k: v[:3] for k, v in train.items()}).shape == (3, 2)
    with pytest.raises(ValueError, match="input"):
        get_task("pathfinder", {**data, "input": "pixel"}, seed=0).prepare()


def test_cosine_pair_head_scores_same_by_scaled_cosine_and_needs_two_classes():
    torch.manual_seed(0)
    model = create_model("encoder_classifier", "mini", dual=True, pair_head="cosine", vocab_size=40)
    ids, pair_ids = torch.randint(1, 40, (3, 12)), torch.randint(1, 40, (3, 12))
    with torch.no_grad():
        model.head.scale.fill_(4.0)
        model.head.bias.fill_(-1.5)
        logits = model(ids, pair_ids=pair_ids)
        u, v = model.embed(ids), model.embed(pair_ids)
    expected = 4.0 * F.cosine_similarity(u, v, dim=-1) - 1.5
    torch.testing.assert_close(logits, torch.stack([torch.zeros(3), expected], dim=-1))
    with pytest.raises(ValueError, match="pair_head"):
        create_model("encoder_classifier", "mini", dual=True, pair_head="cosine", num_classes=3)
    with pytest.raises(ValueError, match="pair_head"):
        create_model("encoder_classifier", "mini", dual=True, pair_head="dot")


@pytest.mark.parametrize("name", list_tasks())
def test_every_task_names_an_unknown_or_mistyped_data_setting_and_its_allowed_keys(name):
    allowed = [f.name for f in dataclasses.fields(task_info(name).cls.Data)]
    for preset in task_info(name).presets:  # every registered preset resolves
        task_settings(name, preset)
    with pytest.raises(ValueError, match=re.escape(f"{name}: unknown data setting 'sizes'; allowed keys are "
                                                   f"{allowed}")):
        get_task(name, {"sizes": 3}, seed=0)
    with pytest.raises(ConfigError, match=f"{name}: unknown data setting 'sizes'"):
        task_settings(name, "tiny", {"data": {"sizes": 3}})
    key = "data_seed" if "data_seed" in allowed else "seq_len"
    with pytest.raises(ValueError, match=f"{name}: data setting '{key}' must be int; got '0'"):
        get_task(name, {key: "0"}, seed=0)


@pytest.mark.parametrize(("name", "preset", "expected"), [
    ("listops", "lra", {"seq_len": 2000, "examples": 100000, "max_depth": 10, "max_args": 10,
                        "min_length": 500, "data_seed": 0, "fractions": (0.96, 0.02, 0.02)}),
    ("recall", "small", {"train_examples": 6000, "val_examples": 600, "test_examples": 1200, "data_seed": 0,
                         "seq_len": 256, "distances": (8, 16, 32, 64, 128, 192), "num_keys": 16,
                         "num_values": 8, "num_pairs": 4, "num_fillers": 16, "pair_gap": 2}),
    ("pathfinder", "small", {"size": 24, "examples": 12000, "data_seed": 0, "fractions": (0.8, 0.1, 0.1),
                             "input": "pixels", "patch": 2, "patch_size": 4, "num_distractors": 0,
                             "path_length": (6, 9), "dash": None, "gap": 0, "dot_radius": None,
                             "curvature": None, "max_turn": None}),
])
def test_a_preset_resolves_to_its_data_settings_over_the_defaults(name, preset, expected):
    assert dataclasses.asdict(get_task(name, task_settings(name, preset).data, seed=0).data) == expected


def test_generated_splits_are_the_generator_at_seeds_3s_plus_the_split():
    from bench.quality.data import mqar

    data = {**task_settings("mqar", "tiny").data, "data_seed": 2}
    task = get_task("mqar", data, seed=0)
    task.prepare()
    for offset, split in enumerate(("train", "val", "test")):
        arrays = mqar.generate(data[f"{split}_examples"], seq_len=data["seq_len"], num_pairs=data["num_pairs"],
                               num_keys=8, num_values=8, num_fillers=4, seed=6 + offset)
        assert all(torch.equal(task.splits[split][k], torch.from_numpy(v)) for k, v in arrays.items())


@pytest.mark.parametrize("name", [n for n in list_tasks() if issubclass(task_info(n).cls, GeneratedTask)])
def test_every_preset_of_a_generated_task_draws_examples(name):
    """A preset whose settings its generator refuses (selective copy's lra preset asked for 64
    distinct data tokens out of 32) fails here, not after hours on a GPU."""
    for preset in task_info(name).presets:
        data = task_settings(name, preset).data
        task = get_task(name, data, seed=0)
        arrays = task.generate(2, seed=0)
        assert all(len(a) == 2 for a in arrays.values()), (name, preset)
