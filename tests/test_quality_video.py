"""The ``video`` task (bench/quality/tasks/video.py), its clip generator
(bench/quality/data/video.py) and its references (majority class, per-frame control)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality.data.video import moving_clips, shrink
from bench.quality.reference import get_reference
from bench.quality.tasks import get_task, task_info

SETTINGS = {"frames": 5, "canvas": 16, "object_size": 6, "min_speed": 1, "max_speed": 3}


def _images(n: int = 10) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(1, 256, size=(n, 12, 12)).astype(np.uint8)  # no blank pixel


def test_the_mover_steps_by_its_speed_in_the_labelled_direction() -> None:
    clips = moving_clips(_images(), 40, seed=3, still_objects=0, **SETTINGS)
    assert clips.videos.shape == (40, 5, 16, 16) and clips.videos.dtype == np.uint8
    assert set(clips.labels.tolist()) == {0, 1}
    for video, label, speed, axis in zip(clips.videos, clips.labels, clips.speed, clips.axis):
        step = speed if label == 1 else -speed  # forward: right (axis 0) or down (axis 1)
        dim = 1 if axis == 0 else 0
        for t in range(4):
            assert np.array_equal(np.roll(video[t], step, axis=dim), video[t + 1])
            assert not np.array_equal(np.roll(video[t], -step, axis=dim), video[t + 1])


def test_a_clip_played_in_reverse_moves_the_other_way() -> None:
    # the same frames in the other order are a clip of the other label: no frame decides
    clips = moving_clips(_images(), 20, seed=1, still_objects=0, **SETTINGS)
    for video, label, speed, axis in zip(clips.videos, clips.labels, clips.speed, clips.axis):
        reverse, dim = video[::-1], 1 if axis == 0 else 0
        other = -speed if label == 1 else speed  # the step of the other label
        assert all(np.array_equal(np.roll(reverse[t], other, axis=dim), reverse[t + 1]) for t in range(4))


def test_a_held_mover_steps_once_every_hold_frames_and_still_reverses() -> None:
    # hold=2: frames 2t and 2t+1 are the same picture (a 2-frame tubelet sees no motion); the
    # step between held pictures is the labelled one, and the reversed clip is the other label's
    settings = {**SETTINGS, "frames": 6}
    clips = moving_clips(_images(), 20, seed=4, still_objects=0, hold=2, **settings)
    for video, label, speed, axis in zip(clips.videos, clips.labels, clips.speed, clips.axis):
        step, dim = (speed if label == 1 else -speed), 1 if axis == 0 else 0
        for t in range(0, 6, 2):
            assert np.array_equal(video[t], video[t + 1])
        for t in range(0, 4, 2):
            assert np.array_equal(np.roll(video[t], step, axis=dim), video[t + 2])
        reverse = video[::-1]
        assert all(np.array_equal(reverse[t], reverse[t + 1]) for t in range(0, 6, 2))
        assert all(np.array_equal(np.roll(reverse[t], -step, axis=dim), reverse[t + 2]) for t in range(0, 4, 2))
    # hold=1 is the default: the same clips as before the setting existed
    default = moving_clips(_images(), 20, seed=4, still_objects=0, **settings)
    assert np.array_equal(default.videos, moving_clips(_images(), 20, seed=4, still_objects=0, hold=1,
                                                       **settings).videos)


def test_the_still_object_stays() -> None:
    clips = moving_clips(_images(), 10, seed=2, still_objects=1, **{**SETTINGS, "object_size": 4})
    still = moving_clips(_images(), 10, seed=2, still_objects=0, **{**SETTINGS, "object_size": 4})
    # where the mover is absent in a frame, that frame shows the still object, the same in every frame
    shown = 0
    for with_still, mover in zip(clips.videos, still.videos):
        background = with_still * (mover == 0)  # (T, C, C)
        visible = (mover == 0).all(axis=0)  # pixels the mover never covers
        assert (background[:, visible] == background[0, visible]).all()
        shown += int(background[0, visible].any())
    assert shown >= 5  # the still object is there (unless the mover's path covers it all)


def test_clips_are_seeded() -> None:
    a = moving_clips(_images(), 6, seed=7, still_objects=1, **SETTINGS)
    b = moving_clips(_images(), 6, seed=7, still_objects=1, **SETTINGS)
    c = moving_clips(_images(), 6, seed=8, still_objects=1, **SETTINGS)
    assert np.array_equal(a.videos, b.videos) and not np.array_equal(a.videos, c.videos)


def test_shrink_averages_cells() -> None:
    image = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    assert shrink(image, 2).tolist() == [[[2, 4], [10, 12]]]  # means 2.5, 4.5, 10.5, 12.5 rounded to even


@pytest.mark.parametrize(("change", "message"), [
    ({"max_speed": 8}, "max_speed: must be < canvas / 2 = 8"),
    ({"object_size": 17}, "object_size: must be <= canvas=16"),
    ({"min_speed": 4}, "max_speed: must be an integer >= 4"),
    ({"frames": 1}, "frames: must be an integer >= 2"),
    ({"hold": 2}, "hold: must divide frames=5 into at least 2 positions; got 2"),
    ({"hold": 0}, "hold: must be an integer >= 1"),
])
def test_bad_settings_name_the_setting(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        moving_clips(_images(), 2, seed=0, still_objects=0, **{**SETTINGS, **change})


@pytest.fixture(scope="module")
def tiny_video():
    info = task_info("video")
    task = get_task("video", info.preset("tiny")["data"], seed=0)
    try:
        task.prepare()
    except Exception as err:  # the Fashion-MNIST package is absent
        pytest.skip(f"video data unavailable: {err}")
    return task


def test_task_feeds_the_vivit_model(tiny_video) -> None:
    from models.registry import create_model

    task = tiny_video
    assert task.model_kind == "vivit" and task.seq_len == 4 * (16 // 8) ** 2
    assert task.splits["train"]["videos"].shape == (64, 4, 16, 16)
    model = create_model("vivit", "mini", **{**task.model_overrides(), "attention": "factorised",
                                             "attention_params": {"axis": "split"}})
    loss, tokens = task.loss(model, task.train_batch(0, 8))
    assert torch.isfinite(loss) and tokens == 8 * task.seq_len
    metrics = task.evaluate(model, "test", limit=None, batch_size=8, final=True)
    conditions = {m.condition for m in metrics if m.name == "accuracy"}
    assert "" in conditions and any(c.startswith("speed=") for c in conditions)


def test_references_score_the_test_split(tiny_video) -> None:
    task = tiny_video
    majority = get_reference("majority_class")
    assert majority.applies(task)
    outcome = majority.compute(task)
    labels = task.splits["test"]["labels"]
    common = int(torch.bincount(task.splits["train"]["labels"]).argmax())
    assert outcome.metrics[0].value == pytest.approx(float((labels == common).float().mean()))
    per_frame = get_reference("per_frame")
    assert per_frame.applies(task) and not get_reference("nearest_class_mean").applies(task)
    accuracy = per_frame.compute(task).metrics[0]
    assert accuracy.name == "accuracy" and 0.0 <= accuracy.value <= 1.0
