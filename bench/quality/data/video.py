"""The ``video`` task's clips, seeded (docs/quality.md, "Video"): an image steps ``speed`` pixels every ``hold``
frames along one axis of a torus, beside ``still_objects`` still images; the label is its direction (1: right
or down)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn.validation import invalid, require_int


@dataclass(frozen=True)
class Clips:
    """``videos (n, T, C, C)`` uint8, ``labels (n,)`` (1: forward), and each clip's ``speed`` and ``axis`` (0: x)."""

    videos: np.ndarray
    labels: np.ndarray
    speed: np.ndarray
    axis: np.ndarray


def shrink(images: np.ndarray, size: int) -> np.ndarray:
    """``images (n, h, w)`` uint8 resized to ``(n, size, size)`` by area averaging."""
    n, h, w = images.shape
    rows = np.linspace(0, h, size + 1).astype(int)
    cols = np.linspace(0, w, size + 1).astype(int)
    out = np.empty((n, size, size), dtype=np.float64)
    for r in range(size):
        for c in range(size):
            out[:, r, c] = images[:, rows[r]:rows[r + 1], cols[c]:cols[c + 1]].mean(axis=(1, 2))
    return np.rint(out).astype(np.uint8)


def check_settings(*, frames: int, canvas: int, object_size: int, min_speed: int, max_speed: int,
                   still_objects: int, hold: int = 1) -> None:
    """ValueError naming the setting that cannot make clips."""
    require_int("frames", frames, minimum=2)
    require_int("hold", hold, minimum=1)
    if frames % hold or frames // hold < 2:
        raise invalid("hold", f"must divide frames={frames} into at least 2 positions; got {hold}")
    require_int("canvas", canvas, minimum=4)
    require_int("object_size", object_size, minimum=1)
    require_int("min_speed", min_speed, minimum=1)
    require_int("max_speed", max_speed, minimum=min_speed)
    require_int("still_objects", still_objects, minimum=0)
    if still_objects > 1:
        raise invalid("still_objects", f"must be 0 or 1; got {still_objects}")
    if object_size > canvas:
        raise invalid("object_size", f"must be <= canvas={canvas}; got {object_size}")
    if 2 * max_speed >= canvas:
        raise invalid("max_speed", f"must be < canvas / 2 = {canvas / 2:g} (a step of half the torus "
                                   f"has no direction); got {max_speed}")


def moving_clips(images: np.ndarray, count: int, *, frames: int, canvas: int, object_size: int,
                 min_speed: int, max_speed: int, still_objects: int, seed: int, hold: int = 1) -> Clips:
    """``count`` clips of objects drawn from ``images (n, h, w)``, a pure function of its arguments."""
    check_settings(frames=frames, canvas=canvas, object_size=object_size, min_speed=min_speed,
                   max_speed=max_speed, still_objects=still_objects, hold=hold)
    require_int("count", count, minimum=0)
    rng = np.random.default_rng(seed)
    objects = shrink(images, object_size)  # (n, s, s)
    picks = rng.integers(0, len(objects), size=(count, 2))  # mover, still
    start = rng.integers(0, canvas, size=(count, 2, 2))  # (clip, object, (y, x))
    speed = rng.integers(min_speed, max_speed + 1, size=count)
    axis = rng.integers(0, 2, size=count)  # 0: along x, 1: along y
    labels = rng.integers(0, 2, size=count)  # 1: +speed (right / down), 0: -speed
    step = np.where(labels == 1, speed, -speed)
    videos = np.zeros((count, frames, canvas, canvas), dtype=np.uint8)
    tile = np.zeros((canvas, canvas), dtype=np.uint8)
    for n in range(count):
        still = _placed(tile, objects[picks[n, 1]], start[n, 1]) if still_objects else tile
        for t in range(frames):
            where = start[n, 0].copy()
            where[1 - axis[n]] += step[n] * (t // hold)  # axis 0 moves x (index 1), axis 1 moves y (index 0)
            videos[n, t] = np.maximum(still, _placed(tile, objects[picks[n, 0]], where))
    return Clips(videos, labels.astype(np.int64), speed.astype(np.int64), axis.astype(np.int64))


def _placed(tile: np.ndarray, obj: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``obj`` on a blank torus of ``tile``'s shape, its top-left corner at ``where (y, x)``."""
    canvas = tile.copy()
    size = obj.shape[0]
    canvas[:size, :size] = obj
    return np.roll(canvas, shift=(int(where[0]), int(where[1])), axis=(0, 1))
