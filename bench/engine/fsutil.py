"""Files a run directory relies on: atomic writes and the one-writer lock (an ``flock``: no stale lock)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, with the mode ``open`` would give a new file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # as open() would make it (mkstemp: 0600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def new_file_mode() -> int:
    """The mode ``open`` gives a new file in this process (0644 under umask 022)."""
    mask = os.umask(0o022)  # the umask is read by setting it and putting it back
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_json(path: str | Path, data: Any) -> None:
    """``data`` as indented JSON, written atomically (see :func:`atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: str | Path, *, what: str) -> Any:
    """Parse a JSON file; ``ValueError`` naming the file and ``what`` it holds when corrupt."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: corrupt {what} (invalid JSON: {err.msg} at line {err.lineno}); "
                         f"delete the file or restore it") from None


class NotWritableError(ValueError):
    """A run directory that cannot be created or written to (``directory``; ``why``)."""

    def __init__(self, directory: Path, why: str) -> None:
        super().__init__(f"cannot write to {directory} ({why}); choose a writable directory")
        self.directory, self.why = directory, why


def require_writable(directory: str | Path) -> Path:
    """``directory``, created and probed with a file; :class:`NotWritableError` otherwise."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise NotWritableError(directory, err.strerror or str(err)) from None
    return directory


class RunLockedError(RuntimeError):
    """Another process holds the run directory's lock."""


class RunLock:
    """Exclusive lock on a run directory for one sweep; the file names its holder for a refused second one."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise RunLockedError(f"{self.path.parent} is in use by another sweep ({holder}); wait for it to finish "
                                 "or choose another --out") from None
        command = " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv))
        info = (f"pid {os.getpid()} on {socket.gethostname()}, `{command}`, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
