"""The trainer reads training losses on the host each step on the CPU, and on CUDA only at a
validation or checkpoint step, in one transfer; a non-finite loss is found at its own step."""

from __future__ import annotations

import math

import torch

from bench.quality.trainer import LossReader


def test_losses_are_read_at_once_unless_deferred():
    reader = LossReader(defer=False)
    assert reader.add(0, torch.tensor(2.5)) == [(0, 2.5)]
    deferred = LossReader(defer=True)
    assert deferred.add(0, torch.tensor(2.5)) == [] and deferred.add(1, torch.tensor(2.0)) == []
    assert deferred.add(2, torch.tensor(1.5, dtype=torch.bfloat16), now=True) == [(0, 2.5), (1, 2.0), (2, 1.5)]
    assert deferred.add(3, torch.tensor(1.0), now=True) == [(3, 1.0)]  # nothing read twice


def test_a_non_finite_loss_keeps_its_step_when_read_later():
    deferred = LossReader(defer=True)
    for step, value in enumerate((1.0, math.nan, 3.0)):
        read = deferred.add(step, torch.tensor(value), now=step == 2)
    bad = [(s, v) for s, v in read if not math.isfinite(v)]
    assert [s for s, _ in bad] == [1]
