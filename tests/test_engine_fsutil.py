"""bench.engine.fsutil: an atomic write gets the mode ``open`` would give (the umask decides, not
``mkstemp``'s 0600) and keeps the old file when it is interrupted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bench.engine.fsutil import atomic_write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_an_atomic_write_gets_the_mode_open_would_give(tmp_path: Path, umask: int,
                                                       mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "results.csv", "a,b\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "results.csv") == mode


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    path.write_text("old")

    def fail(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]
