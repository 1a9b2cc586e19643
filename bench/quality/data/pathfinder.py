"""Pathfinder images (Linsley et al. 2018; used by the Long Range Arena): white curved, dashed paths and two dots
on black, label 1 when both dots end the same path. Every image has ``num_distractors + 2`` paths, so the count
gives nothing away; paths never come within one pixel of another path or a dot, so in a negative no chain of
paths joins the dots; a negative's second dot ends an undrawn walk from the first with the same dynamics, so
dot distances follow one distribution in both classes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attn.validation import invalid, require_int, require_number
from bench.quality.data.cache import load_or_generate_npz
from bench.quality.data.pathfinder_canvas import Canvas

#: Bump when the generator's output for the same arguments changes (invalidates caches).
VERSION = 1

_CHUNK = 4096  # images generated per chunk (bounds memory for large sizes)


def default_params(size: int) -> dict[str, Any]:
    """Default generation parameters for images of ``size`` x ``size`` pixels."""
    scale = size / 32
    return {
        "num_distractors": max(1, round(4 * scale)),
        "path_length": (max(4, round(0.45 * size)), max(5, round(0.7 * size))),
        "dash": 3,
        "gap": 1,
        "dot_radius": 1.5 * max(1.0, scale ** 0.5),
        "curvature": 0.3,
        "max_turn": 0.7,
    }


def generate(
    num_examples: int,
    *,
    seed: int,
    size: int = 32,
    num_distractors: int | None = None,
    path_length: tuple[int, int] | None = None,
    dash: int | None = None,
    gap: int | None = None,
    dot_radius: float | None = None,
    curvature: float | None = None,
    max_turn: float | None = None,
    return_meta: bool = False,
) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(images, labels)``: uint8 ``(n, size, size)``, exactly ``n // 2`` positives in random order (arguments
    left None: :func:`default_params`). ``return_meta`` adds ``{"paths": int8 map of the undashed paths (index,
    -1 background; path 0 carries the first dot), "dots": (n, 2, 2) centres (row, column)}``."""
    params = _resolve(size, num_distractors, path_length, dash, gap, dot_radius, curvature, max_turn)
    require_int("num_examples", num_examples, minimum=0)
    rng = np.random.default_rng(seed)
    labels = np.zeros(num_examples, dtype=np.int64)
    labels[: num_examples // 2] = 1
    labels = labels[rng.permutation(num_examples)]
    images = np.zeros((num_examples, size, size), dtype=np.uint8)
    paths = np.full((num_examples, size, size), -1, dtype=np.int8)
    dots = np.zeros((num_examples, 2, 2), dtype=np.int64)
    for start in range(0, num_examples, _CHUNK):
        stop = min(num_examples, start + _CHUNK)
        chunk = Canvas(labels[start:stop], params, rng)
        chunk.run()
        images[start:stop], paths[start:stop], dots[start:stop] = chunk.image, chunk.owner, chunk.dots
    if return_meta:
        return images, labels, {"paths": paths, "dots": dots}
    return images, labels


def _resolve(
    size: int,
    num_distractors: int | None,
    path_length: tuple[int, int] | None,
    dash: int | None,
    gap: int | None,
    dot_radius: float | None,
    curvature: float | None,
    max_turn: float | None,
) -> dict[str, Any]:
    require_int("size", size, minimum=12)
    given = {
        "num_distractors": num_distractors, "path_length": path_length, "dash": dash, "gap": gap,
        "dot_radius": dot_radius, "curvature": curvature, "max_turn": max_turn,
    }  # fmt: skip
    params = default_params(int(size))
    params.update({k: v for k, v in given.items() if v is not None})
    params["size"] = int(size)
    require_int("num_distractors", params["num_distractors"], minimum=0)
    if params["num_distractors"] + 2 > 127:
        raise invalid("num_distractors", f"must be at most 125; got {params['num_distractors']}")
    lo, hi = (int(v) for v in params["path_length"])
    if not 2 <= lo <= hi <= size * size:
        raise invalid("path_length", f"must be (low, high) with 2 <= low <= high; got {params['path_length']!r}")
    params["path_length"] = (lo, hi)
    require_number("dash", params["dash"], minimum=1)
    require_number("gap", params["gap"], minimum=0)
    if not 0.5 <= params["dot_radius"] <= size / 8:
        raise invalid("dot_radius", f"must lie in [0.5, {size / 8}]; got {params['dot_radius']}")
    require_number("curvature", params["curvature"], minimum=0)
    if not 0 < params["max_turn"] <= math.pi / 2:
        raise invalid("max_turn", f"must lie in (0, pi/2]; got {params['max_turn']}")
    return params


def dots_connected(paths: np.ndarray, dots: np.ndarray) -> np.ndarray:
    """Whether the two dots of each image are joined through path pixels (``paths``: a meta map or a bool mask)."""
    paths = np.asarray(paths)
    mask = paths if paths.dtype == bool else paths >= 0
    n, h, w = mask.shape
    rows = np.arange(n)
    reached = np.zeros_like(mask)
    reached[rows, dots[:, 0, 0], dots[:, 0, 1]] = mask[rows, dots[:, 0, 0], dots[:, 0, 1]]
    while True:
        grown = reached.copy()
        padded = np.pad(reached, ((0, 0), (1, 1), (1, 1)))
        for dy in (0, 1, 2):
            for dx in (0, 1, 2):
                grown |= padded[:, dy : dy + h, dx : dx + w]
        grown &= mask
        if np.array_equal(grown, reached):
            break
        reached = grown
    return reached[rows, dots[:, 1, 0], dots[:, 1, 1]]


def load_or_generate(num_examples: int, *, seed: int, **params: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`generate` cached as ``.npz``, keyed by every resolved parameter and :data:`VERSION`."""
    if "return_meta" in params:
        raise ValueError("load_or_generate does not take return_meta; call generate for the bookkeeping")
    size = params.pop("size", 32)
    resolved = _resolve(
        size, *(params.pop(k, None) for k in
                ("num_distractors", "path_length", "dash", "gap", "dot_radius", "curvature", "max_turn"))
    )  # fmt: skip
    if params:
        raise ValueError(f"unknown pathfinder parameters {sorted(params)}; allowed: {sorted(default_params(32))}")
    key = {"num_examples": num_examples, "seed": seed, **resolved}
    kwargs = {k: v for k, v in resolved.items() if k != "size"}

    def build() -> dict[str, np.ndarray]:
        images, labels = generate(num_examples, seed=seed, size=resolved["size"], **kwargs)
        return {"images": images, "labels": labels}

    arrays = load_or_generate_npz("pathfinder", key, VERSION, build)
    return arrays["images"], arrays["labels"]
