"""Drawing one chunk of Pathfinder images with vectorised numpy, one path index at a time; an image whose paths
cannot all be placed is drawn again from scratch, so every image has the same number of paths."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LAG = 4  # a path may touch only its own last few pixels


def _box(radius: int) -> np.ndarray:
    """Offsets (dy, dx) of the (2r+1) x (2r+1) square around a pixel."""
    r = np.arange(-radius, radius + 1)
    dy, dx = np.meshgrid(r, r, indexing="ij")
    return np.stack([dy.ravel(), dx.ravel()], axis=1)


def _disc(radius: float) -> np.ndarray:
    """Offsets (dy, dx) of the pixels within ``radius`` of a pixel centre."""
    box = _box(math.floor(radius))
    return box[(box**2).sum(axis=1) <= radius * radius + 1e-9]


class Canvas:
    """One chunk of images: :meth:`run` leaves them in ``image``, the path map in ``owner``, the dots in ``dots``."""

    def __init__(self, labels: np.ndarray, params: dict[str, Any], rng: np.random.Generator) -> None:
        self.labels = labels
        self.p = params
        self.rng = rng
        n, s = len(labels), params["size"]
        self.n, self.s = n, s
        self.disc = _disc(params["dot_radius"])
        self.dot_reach = int(np.abs(self.disc).max())
        self.margin = self.dot_reach + 1
        self.near = _box(1)
        self.far = _box(self.dot_reach + 1)
        self.image = np.zeros((n, s, s), dtype=np.uint8)
        self.owner = np.full((n, s, s), -1, dtype=np.int8)
        self.blocked = np.zeros((n, s, s), dtype=bool)  # within 1 pixel of a finished path or dot
        self.blocked_far = np.zeros((n, s, s), dtype=bool)  # too close to others for a dot centre
        self.stamp = np.full((n, s, s), -1, dtype=np.int32)  # step at which the walk drew a pixel, else -1
        self.dots = np.zeros((n, 2, 2), dtype=np.int64)

    def run(self) -> None:
        pending = np.arange(self.n)
        for _ in range(50):
            if pending.size == 0:
                return
            self._reset(pending)
            positive = self.labels[pending] == 1
            # Path 0 carries the first dot at its start; positives get the second dot at its end.
            failed = ~self._add_path(pending, 0, dot_start=np.ones(pending.size, bool), dot_end=positive)
            # negatives: the second dot starts path 1, where a positive's second dot could be
            neg = np.flatnonzero(~failed & ~positive)
            starts = np.zeros((pending.size, 2), dtype=np.int64)
            placed_b = self._place_second_dot(pending[neg])
            failed[neg[~placed_b[0]]] = True
            starts[neg] = placed_b[1]
            ok = ~failed
            failed[ok] |= ~self._add_path(
                pending[ok], 1, dot_start=~positive[ok], dot_end=np.zeros(ok.sum(), bool),
                start=np.where(positive[ok, None], -1, starts[ok]),
            )
            ok = ~failed
            for k in range(2, self.p["num_distractors"] + 2):
                idx = pending[ok]
                placed = self._add_path(idx, k, dot_start=np.zeros(idx.size, bool), dot_end=np.zeros(idx.size, bool))
                sub = np.flatnonzero(ok)
                failed[sub[~placed]] = True
                ok = ~failed
            pending = pending[failed]
        raise RuntimeError(
            f"could not place {self.p['num_distractors'] + 2} paths of length {self.p['path_length']} in "
            f"{pending.size} images of size {self.s}; use fewer num_distractors or a shorter path_length"
        )

    def _place_second_dot(self, neg_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Second-dot centres ``(ok, centre)`` of negatives: the end of an undrawn walk from the first dot."""
        w = neg_rows.size
        centre = np.zeros((w, 2), dtype=np.int64)
        ok = np.zeros(w, dtype=bool)
        first = self.dots[neg_rows, 0]
        for _ in range(20):
            todo = np.flatnonzero(~ok)
            if todo.size == 0:
                break
            alive, trace, _, length = self._walk(
                neg_rows[todo], np.zeros(todo.size, bool), np.ones(todo.size, bool), first[todo], ghost=True
            )
            end = trace[np.arange(todo.size), length]
            centre[todo[alive]] = end[alive]
            ok[todo[alive]] = True
        return ok, centre

    def _reset(self, rows: np.ndarray) -> None:
        for array, value in ((self.image, 0), (self.owner, -1), (self.blocked, False), (self.blocked_far, False)):
            array[rows] = value

    def _add_path(
        self, rows: np.ndarray, k: int, *, dot_start: np.ndarray, dot_end: np.ndarray, start: np.ndarray | None = None
    ) -> np.ndarray:
        """Draw path ``k`` in images ``rows`` (``start``: a fixed first pixel, or negative); True where placed."""
        placed = np.zeros(rows.size, dtype=bool)
        todo = np.arange(rows.size)
        if start is None:
            start = np.full((rows.size, 2), -1, dtype=np.int64)
        for _ in range(20):
            if todo.size == 0:
                break
            ok, trace, on, length = self._walk(rows[todo], dot_start[todo], dot_end[todo], start[todo])
            good = todo[ok]
            self._commit(rows[good], k, trace[ok], on[ok], length[ok], dot_start[good], dot_end[good])
            placed[good] = True
            todo = todo[~ok]
        return placed

    def _walk(
        self,
        rows: np.ndarray,
        dot_start: np.ndarray,
        dot_end: np.ndarray,
        fixed_start: np.ndarray,
        *,
        ghost: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Random walks ``(ok, trace (w, L, 2), on (w, L), length (w,))``; a ``ghost`` ignores drawn paths."""
        p, rng, s, m = self.p, self.rng, self.s, self.margin
        w = rows.size
        lo, hi = p["path_length"]
        length = rng.integers(lo, hi + 1, size=w)
        max_len = int(length.max()) if w else 0
        trace = np.zeros((w, max_len + 1, 2), dtype=np.int64)
        alive = np.ones(w, dtype=bool)

        # Start: a free pixel (far from other paths when it carries a dot), random heading.
        blocked = self.blocked if not ghost else np.zeros_like(self.blocked[:1])
        fixed = fixed_start[:, 0] >= 0
        start = np.where(fixed[:, None], fixed_start, rng.integers(m, s - m, size=(w, 2)))
        for _ in range(50):
            bad = blocked[rows if not ghost else 0, start[:, 0], start[:, 1]]
            bad |= dot_start & self.blocked_far[rows, start[:, 0], start[:, 1]]
            redo = bad & ~fixed
            if not redo.any():
                break
            start[redo] = rng.integers(m, s - m, size=(int(redo.sum()), 2))
        alive &= ~bad
        pos = start.astype(np.float64)
        theta = rng.uniform(0, 2 * np.pi, size=w)
        trace[:, 0] = start
        self.stamp[rows, start[:, 0], start[:, 1]] = 0  # all -1 elsewhere: each walk cleans up after itself

        # Candidate turns: the sampled one first, then growing deviations on either side.
        offsets = p["max_turn"] * np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0])
        for t in range(1, max_len + 1):
            stepping = alive & (t <= length)
            if not stepping.any():
                break
            idx = np.flatnonzero(stepping)
            r = rows[idx]
            turn = np.clip(rng.normal(0.0, p["curvature"], size=idx.size), -p["max_turn"], p["max_turn"])
            cand = theta[idx, None] + turn[:, None] + offsets[None, :]
            cy = pos[idx, 0, None] + np.sin(cand)
            cx = pos[idx, 1, None] + np.cos(cand)
            py, px = np.rint(cy).astype(np.int64), np.rint(cx).astype(np.int64)
            valid = (py >= m) & (py < s - m) & (px >= m) & (px < s - m)
            qy, qx = np.clip(py, m, s - m - 1), np.clip(px, m, s - m - 1)
            rr = r[:, None]
            valid &= ~blocked[rr if not ghost else 0, qy, qx]
            for dy, dx in self.near:  # no touching the path's own older pixels
                old = self.stamp[rr, qy + dy, qx + dx]
                valid &= ~((old >= 0) & (old < t - LAG))
            found = valid.any(axis=1)
            choice = np.argmax(valid, axis=1)
            alive[idx[~found]] = False
            sel = np.flatnonzero(found)
            i, c = idx[sel], choice[sel]
            theta[i] = cand[sel, c]
            pos[i, 0], pos[i, 1] = cy[sel, c], cx[sel, c]
            trace[i, t, 0], trace[i, t, 1] = py[sel, c], px[sel, c]
            keep = self.stamp[r[sel], py[sel, c], px[sel, c]]
            self.stamp[r[sel], py[sel, c], px[sel, c]] = np.where(keep >= 0, keep, t)

        self.stamp[rows[:, None], trace[..., 0], trace[..., 1]] = -1  # unreached steps hit (0, 0): harmless
        # Pad finished traces with their last pixel; a dotted end must be far from other paths.
        steps = np.arange(max_len + 1)
        last = trace[np.arange(w), length]
        trace = np.where((steps[None, :] > length[:, None])[..., None], last[:, None, :], trace)
        alive &= ~(dot_end & self.blocked_far[rows, last[:, 0], last[:, 1]])
        period = p["dash"] + p["gap"]
        phase = rng.integers(0, period, size=w)
        on = ((steps[None, :] + phase[:, None]) % period) < p["dash"]
        return alive, trace, on, length

    def _commit(
        self,
        rows: np.ndarray,
        k: int,
        trace: np.ndarray,
        on: np.ndarray,
        length: np.ndarray,
        dot_start: np.ndarray,
        dot_end: np.ndarray,
    ) -> None:
        """Record placed paths (and their dots) in the image and the bookkeeping arrays."""
        if rows.size == 0:
            return
        steps = trace.shape[1]
        rr = np.repeat(rows, steps)
        ys, xs = trace[..., 0].ravel(), trace[..., 1].ravel()
        self.owner[rr, ys, xs] = k
        lit = on.ravel()
        self.image[rr[lit], ys[lit], xs[lit]] = 255
        pixels = [(rr, ys, xs)]
        ends = {0: dot_start, 1: dot_end}
        for slot, (step, wanted) in enumerate(((np.zeros_like(length), ends[0]), (length, ends[1]))):
            sel = np.flatnonzero(wanted)
            if sel.size == 0:
                continue
            centre = trace[sel, step[sel]]
            dot_slot = 0 if k == 0 and slot == 0 else 1
            self.dots[rows[sel], dot_slot] = centre
            dr = np.repeat(rows[sel], len(self.disc))
            dy = (centre[:, None, 0] + self.disc[None, :, 0]).ravel()
            dx = (centre[:, None, 1] + self.disc[None, :, 1]).ravel()
            self.owner[dr, dy, dx] = k
            self.image[dr, dy, dx] = 255
            pixels.append((dr, dy, dx))
        for pr, py, px in pixels:
            for oy, ox in self.near:
                self.blocked[pr, py + oy, px + ox] = True
            for oy, ox in self.far:
                self.blocked_far[pr, np.clip(py + oy, 0, self.s - 1), np.clip(px + ox, 0, self.s - 1)] = True
