"""Which cases of a parametrised family the default run keeps.

A family that repeats one check over every example parameter set of every variant keeps the
first set of each variant in the default run (``python -m pytest``: every variant is still
checked); the other sets are marked ``slow``, so the full run (``-m ''``) checks them all."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import pytest


def first_of_each(cases: Iterable[Sequence[Any]],
                  key: Callable[[Sequence[Any]], Hashable] = lambda case: case[0]) -> list[Any]:
    """``cases`` as ``pytest.param`` s: the first case of each ``key`` (by default its first
    value, the variant's name) as it is, every later one marked ``slow``."""
    seen: set[Hashable] = set()
    params = []
    for case in cases:
        first = key(case) not in seen
        seen.add(key(case))
        params.append(pytest.param(*case, marks=() if first else (pytest.mark.slow,)))
    return params
