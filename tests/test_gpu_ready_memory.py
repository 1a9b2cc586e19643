"""While one case of a unit uses the GPU, no other case's worker holds GPU
memory (inputs, cached masks, the allocator's cached pool), so a case's peak and its OOM
boundary do not depend on which kernels ran before it (see docs/gpu.md).

Both halves run on the CPU: the driver's side with recording fake workers (the order of the
messages is the protocol), the worker's side with ``torch.cuda`` replaced by recorders.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from bench.speed import rounds, worker
from bench.speed.cases import Case
from bench.speed.rounds import CaseRun, run_rounds

KERNELS = ("reference", "sdpa", "flex")
DEVICE_COMMANDS = ("warm", "prepare", "time", "probe", "finish")


def _case(kernel: str, device: str, passes: tuple[str, ...] = ("fwd", "bwd")) -> Case:
    return Case(variant="full", label="full", params=(), kernel=kernel, seq_len=4096, batch=1,
                heads=4, head_dim=64, dtype="bfloat16", device=device, causal=False,
                passes=passes, repeats=3, warmup=1, timeout_s=60, max_memory_gb=None,
                threads=None, time_budget_s=1.0, plugins=(), min_repeats=3)


class _Process:
    def is_alive(self) -> bool:
        return True


def _fake_worker(log: list[tuple[str, str]]) -> type:
    """A :class:`bench.engine.process.Worker` stand-in answering the case protocol and
    logging ``(kernel, command)`` for every message."""

    class FakeWorker:
        def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
            self.kernel = args[0]["kernel"]
            self.process = _Process()

        def receive(self, timeout_s: float) -> tuple[Any, ...]:
            log.append((self.kernel, "start"))
            return ("ready", {"flops": {"fwd": 1e9, "bwd": 2e9, "fwd_bwd": 3e9},
                              "flops_kind": "useful", "density": 1.0, "threads": 1})

        def request(self, message: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
            command = message[0]
            log.append((self.kernel, command))
            if command == "warm":
                return ("warmed", {"first_call_ms": 1.0})
            if command == "prepare":
                return ("prepared", {"estimate_ms": 1.0,
                                     "peak_mem_bytes": 10, "rss_peak_bytes": None})
            if command == "time":
                return ("timed", 0.001)
            if command == "finish":
                return ("finished", {"kernel": self.kernel, "kernel_path": self.kernel})
            if command == "release":
                return ("released", 0)
            if command == "probe":  # the calibration probe before and after the rounds
                return ("probed", 0.0004)
            raise AssertionError(f"unexpected message {message!r}")

        def kill(self) -> None:
            log.append((self.kernel, "kill"))

        def close(self) -> None:
            log.append((self.kernel, "close"))

    return FakeWorker


def _run(monkeypatch: pytest.MonkeyPatch, device: str) -> tuple[list[dict], list[tuple[str, str]]]:
    log: list[tuple[str, str]] = []
    monkeypatch.setattr(rounds, "Worker", _fake_worker(log))
    monkeypatch.setattr(rounds, "HANDOVER_S", 0.0)
    runs = tuple(CaseRun(_case(k, device), ("fwd", "bwd")) for k in KERNELS)
    return run_rounds(runs, "unit0"), log


def test_a_cuda_unit_never_lets_two_cases_hold_the_gpu(monkeypatch):
    rows, log = _run(monkeypatch, "cuda")
    holding: set[str] = set()
    for kernel, command in log:
        if command in DEVICE_COMMANDS:
            assert holding <= {kernel}, f"{kernel} {command} while {sorted(holding)} hold the GPU"
            holding.add(kernel)
        elif command in ("release", "kill", "close"):
            holding.discard(kernel)
    assert sum(command == "release" for _, command in log) == len(KERNELS) * 2  # per pass
    assert [r["status"] for r in rows] == ["ok"] * len(KERNELS) * 2
    assert {r["interleaved"] for r in rows} == {1}  # honest: timed one after the other


def test_a_cpu_unit_is_still_timed_in_interleaved_rounds(monkeypatch):
    rows, log = _run(monkeypatch, "cpu")
    assert not any(command == "release" for _, command in log)
    times = [kernel for kernel, command in log if command == "time"]
    assert times[:3] == list(KERNELS)  # A, B, C, A, B, C, ...
    assert {r["interleaved"] for r in rows} == {len(KERNELS)}


class _Module:
    """Stands in for an attention module holding cached device memory."""


class _Conn:
    def __init__(self, messages: list[tuple[Any, ...]]) -> None:
        self.messages, self.sent = list(messages), []

    def recv(self) -> tuple[Any, ...]:
        return self.messages.pop(0)

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


class _Runner:
    def __init__(self, case: Case, module: Any, pass_name: str) -> None:
        self.module = module

    def warm(self) -> dict[str, Any]:
        return {"first_call_ms": 1.0}

    def prepare(self) -> dict[str, Any]:
        return {"estimate_ms": 1.0}


def test_the_worker_releases_its_module_and_cached_pool_and_rebuilds(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(worker.torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(worker.torch.cuda, "memory_reserved", lambda *a: 0)
    first = [_Module()]
    gone = weakref.ref(first[0])
    alive_at_rebuild: list[bool] = []

    def build(case: Case) -> tuple[_Module, dict[str, Any]]:
        gc.collect()
        alive_at_rebuild.append(gone() is not None)
        return _Module(), {}

    monkeypatch.setattr(worker, "_build", build)
    monkeypatch.setattr(worker, "_runner", _Runner)
    conn = _Conn([("warm", "fwd"), ("prepare", "fwd"), ("release",), ("warm", "bwd"), ("prepare", "bwd"),
                  ("exit",)])
    worker._serve(_case("reference", "cuda"), first.pop(), conn)  # the worker's only reference
    assert [m[0] for m in conn.sent] == ["warmed", "prepared", "released", "warmed", "prepared"]
    assert conn.sent[2] == ("released", 0)
    assert "empty_cache" in calls
    assert alive_at_rebuild == [False]  # released (cached masks with it), then built again
