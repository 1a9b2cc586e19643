"""Checkpoints are verified before use, and a diverged run is never ``ok``: random bytes in a
checkpoint, a cut-short file or a broken header are one line naming the file, the file is
moved aside and training resumes from the checkpoint before it (to the same result) or
starts over, said in the log and in metrics.json; a NaN loss stops the run as ``diverged``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from bench.quality.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from bench.quality.train import METRICS, RunSpec, train_run
from bench.quality.trainer import LAST, PREVIOUS

#: a tiny run with a checkpoint every 4 steps
OVERRIDES = {"train": {"steps": 12, "eval_every": 4, "checkpoint_every": 4, "batch_size": 8}}


def _spec(out: Path, **train: float) -> RunSpec:
    return RunSpec(task="recall", variant="full", preset="tiny", seed=1, out=str(out),
                   overrides={"train": {**OVERRIDES["train"], **train}})


def _checkpoint(path: Path) -> None:
    tensors = {"model.w": torch.arange(4096, dtype=torch.float32).reshape(64, 64),
               "model.b": torch.ones(64)}
    save_checkpoint(path, tensors, {"fingerprint": "f", "progress": {"step": 100}})


def _random_bytes_in_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = os.urandom(4096)
    path.write_bytes(bytes(data))


def _values(rows: list[dict]) -> list[tuple]:
    return [(r["split"], r["metric"], r["condition"], r["value"]) for r in rows]


class _Stop(Exception):
    pass


def _interrupted(spec: RunSpec, at_step: int) -> None:
    """Run ``spec`` until ``at_step`` (its checkpoints written), then stop as a kill would."""

    def stop(step: int, _loss: float, _rate: float) -> None:
        if step == at_step:
            raise _Stop

    with pytest.raises(_Stop):
        train_run(spec, log=lambda _: None, on_step=stop)


@pytest.mark.parametrize("damage", ["random_bytes", "cut_short", "broken_header"])
def test_a_damaged_checkpoint_is_one_error_naming_the_file(tmp_path, damage):
    path = tmp_path / LAST
    _checkpoint(path)
    if damage == "random_bytes":
        _random_bytes_in_the_middle(path)
    elif damage == "cut_short":
        path.write_bytes(path.read_bytes()[:-5000])
    else:
        data = bytearray(path.read_bytes())
        data[8:24] = b"{" * 16
        path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_sound_checkpoint_loads_as_saved(tmp_path):
    _checkpoint(tmp_path / LAST)
    tensors, meta = load_checkpoint(tmp_path / LAST)
    assert meta["progress"]["step"] == 100 and torch.equal(tensors["model.b"], torch.ones(64))


def test_a_corrupted_last_checkpoint_resumes_from_the_one_before_to_the_same_result(tmp_path):
    clean = train_run(_spec(tmp_path / "clean"), log=lambda _: None)
    spec = _spec(tmp_path / "run")
    _interrupted(spec, at_step=10)  # checkpoints at steps 4 and 8
    _random_bytes_in_the_middle(tmp_path / "run" / LAST)
    said: list[str] = []
    resumed = train_run(spec, log=said.append)
    assert _values(resumed) == _values(clean) and resumed[0]["status"] == "ok"
    bad = [line for line in said if "do not match the digest" in line]
    assert len(bad) == 1 and str(tmp_path / "run" / LAST) in bad[0]
    assert "moved to last.safetensors.corrupt" in bad[0]
    assert f"resumed from step 4 ({PREVIOUS})" in said
    assert (tmp_path / "run" / "last.safetensors.corrupt").exists()
    metrics = json.loads((tmp_path / "run" / METRICS).read_text())
    assert all("do not match the digest" in row["recovery"] for row in metrics)


def test_with_no_sound_checkpoint_left_training_starts_over_and_says_so(tmp_path):
    spec = _spec(tmp_path / "run", steps=6)
    _interrupted(spec, at_step=5)  # one checkpoint, at step 4
    (tmp_path / "run" / LAST).write_bytes((tmp_path / "run" / LAST).read_bytes()[:1000])
    said: list[str] = []
    rows = train_run(spec, log=said.append)
    assert rows[0]["status"] == "ok" and rows[0]["steps"] == 6
    assert any("not a readable checkpoint" in s and "training starts over" in s for s in said)
    assert not any(s.startswith("resumed from") for s in said)


def test_a_loss_that_becomes_nan_ends_the_run_as_diverged_never_ok(tmp_path):
    spec = _spec(tmp_path / "run", lr=1e30, grad_clip=0.0)
    said: list[str] = []
    rows = train_run(spec, log=said.append)
    assert [r["status"] for r in rows] == ["diverged"]
    assert "the training loss became nan" in rows[0]["reason"]
    assert rows[0]["split"] == "-" and "value" not in rows[0]
    written = json.loads((tmp_path / "run" / METRICS).read_text())
    assert [r["status"] for r in written] == ["diverged"]
    assert any("the run diverged" in s for s in said)


# A checkpoint is readable by others as results are (the umask decides, not mkstemp's 0600).
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_quality_checkpoint_is_readable_by_others_as_results_are(tmp_path: Path) -> None:
    import torch

    from bench.quality.checkpoint import load_checkpoint, save_checkpoint

    old = os.umask(0o022)
    try:
        save_checkpoint(tmp_path / "last.safetensors", {"w": torch.ones(2)}, {"step": 1})
    finally:
        os.umask(old)
    assert _mode(tmp_path / "last.safetensors") == 0o644
    tensors, meta = load_checkpoint(tmp_path / "last.safetensors")
    assert meta == {"step": 1} and tensors["w"].tolist() == [1.0, 1.0]
