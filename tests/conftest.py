"""Shared pytest configuration: GPU tests skip cleanly without CUDA; when pytest-xdist runs
tests in parallel, OpenMP threads wait passively and a test marked ``serial`` runs with no
other test beside it.

Passive waits: torch's OpenMP threads spin at each barrier by default (libgomp). With the
workers, their case and kit processes and their threads sharing the cores, a spinning thread
holds the core its sibling needs to reach the barrier: a conformance check took 5-30 times as
long. ``OMP_WAIT_POLICY=PASSIVE`` (unless set already) is set before the workers start, so
they and every process they start inherit it; the number of threads is left as it is (tests
check that sweeps record and pass on torch's default).

``serial`` is for tests whose assertions read the machine: times, resident memory, page
faults. A parallel neighbour would share the CPU and memory with them; under xdist each
worker holds a shared lock for the whole of each test it runs (setup, call and teardown, so a
module-scoped fixture that measures is covered) and a ``serial`` test holds it exclusively.
A waiting ``serial`` test closes a turnstile first, so the other workers finish the test they
are in and wait, rather than keep it waiting for ever. Without xdist nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The files holding ``serial`` tests run first, whole (their module fixtures are built once): xdist gives
    # the first half of the list to one worker, so they run at the start, while the other worker is in its
    # first tests, instead of each waiting for whatever long test the other worker is in to end.
    serial_files = {item.path for item in items if item.get_closest_marker("serial") is not None}
    items.sort(key=lambda item: item.path not in serial_files)  # stable: the order is kept otherwise
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


class _SerialLock:
    """A readers-writer lock shared by the xdist workers of one run: two ``flock`` files in the
    run's base temporary directory (the parent of each worker's own)."""

    def __init__(self, directory: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self._turnstile = os.open(directory / "serial-turnstile.lock", flags, 0o600)
        self._room = os.open(directory / "serial-room.lock", flags, 0o600)

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        if exclusive:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # no new test starts beside us ...
            try:
                fcntl.flock(self._room, fcntl.LOCK_EX)  # ... and the running ones finish
                try:
                    yield
                finally:
                    fcntl.flock(self._room, fcntl.LOCK_UN)
            finally:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(self._turnstile, fcntl.LOCK_SH)  # wait while a serial test waits or runs
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            fcntl.flock(self._room, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(self._room, fcntl.LOCK_UN)


_serial_lock: _SerialLock | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _serial_lock
    # `auto` reads this machine's tuning file (`attn-bench tune`, docs/kernels.md) unless told not to: tests
    # expect its fixed table (a test of a tuning file points the variable at a file of its own)
    os.environ["ATTN_BENCH_TUNING"] = "off"
    worker = getattr(config, "workerinput", None)  # set on pytest-xdist's workers only
    if worker is None and getattr(config.option, "numprocesses", None):  # xdist's controller
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by libgomp as torch loads
    if worker is not None and config.option.basetemp:
        _serial_lock = _SerialLock(Path(config.option.basetemp).parent)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: the wait is no test's time or timeout
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if _serial_lock is None:
        return (yield)
    with _serial_lock.hold(exclusive=item.get_closest_marker("serial") is not None):
        return (yield)


@pytest.fixture(autouse=True)
def registries_restored() -> Iterator[None]:
    """Every test leaves the four registries (attentions, kernels, model kinds, tasks) as it
    found them: a test that registers, overwrites or unregisters a name (the baseline packages'
    tests unregister theirs) cannot take an installed plug-in away from the tests after it,
    whose parameters were collected while it was registered. A module first imported during
    the test whose registrations are rolled back is forgotten too, so that the next import
    registers them again. The built-ins and the plug-ins of installed entry points are loaded
    first."""
    import sys

    from attn.kernels import KERNELS, kernel_names
    from attn.registration import REGISTRY
    from attn.registry import list_attention
    from bench.quality.tasks import TASKS
    from models.registry import MODELS

    list_attention()  # loads the entry points once
    kernel_names()  # registers the built-in kernels once
    tables = (REGISTRY, KERNELS, MODELS, TASKS)
    saved = [table.snapshot() for table in tables]
    names = {name: getattr(obj, "name", None) for name, obj in REGISTRY.items()}
    modules = set(sys.modules)
    yield
    rolled_back = {table.sources.get(name, "").rpartition(" ")[2].partition(":")[0]
                   for table, (entries, _) in zip(tables, saved) for name, obj in table.items()
                   if entries.get(name) is not obj}
    for table, snapshot in zip(tables, saved):
        table.restore(snapshot)
    for name, obj in REGISTRY.items():  # register_attention sets a class's name
        if names[name] is not None and getattr(obj, "name", None) != names[name]:
            obj.name = names[name]
    for module in rolled_back - modules:
        sys.modules.pop(module, None)


@pytest.fixture
def sweep_out(tmp_path: Path) -> tuple[Path, str]:
    """A small sweep run through the CLI under umask 022: its run directory and what it printed."""
    import yaml
    from typer.testing import CliRunner

    from bench.cli import app
    from bench.engine.testing import unregister_test_variants

    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
        "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
        "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}]}))
    old = os.umask(0o022)
    try:
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "--no-plots"])
    finally:
        os.umask(old)
        unregister_test_variants()
    assert result.exit_code == 0, result.output
    return tmp_path / "out", result.output
