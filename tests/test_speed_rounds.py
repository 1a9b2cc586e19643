"""A case's first call (compiles, caches) runs before its clock: within ``timeout_s`` plus,
where its kernel compiles per shape, ``compile_timeout_s``; outliving that is a
``compile_timeout`` row that never skips the larger lengths of its curve."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.speed import rounds
from bench.speed.cases import Case
from bench.speed.rounds import CaseRun, may_compile, run_rounds
from bench.speed.unit import speed_chain


def _case(kernel: str, device: str = "cpu", seq_len: int = 4096) -> Case:
    return Case(variant="sliding_window", label="window", params=(("window", 64),), kernel=kernel,
                seq_len=seq_len, batch=1, heads=2, head_dim=16, dtype="float32", device=device,
                causal=False, passes=("fwd",), repeats=3, warmup=1, timeout_s=5, max_memory_gb=None,
                threads=None, time_budget_s=1.0, plugins=(), min_repeats=3, compile_timeout_s=40)


def _worker_whose_first_call_hangs(limits: list[float]) -> type:
    class HangingWorker:
        def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
            self.process = self

        def is_alive(self) -> bool:
            return True

        def receive(self, timeout_s: float) -> tuple[Any, ...]:
            return ("ready", {"flops": {"fwd": 1e9}, "flops_kind": "useful", "density": 1.0, "threads": 1})

        def request(self, message: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
            assert message[0] == "warm", message  # nothing is timed before the first call ends
            limits.append(timeout_s)
            raise TimeoutError

        def kill(self) -> None:
            pass

        close = kill

    return HangingWorker


@pytest.mark.parametrize(("kernel", "device", "status", "limit"), [
    ("flex", "cpu", "compile_timeout", 45), ("auto", "cuda", "compile_timeout", 45),
    ("sdpa", "cpu", "timeout", 5), ("auto", "cpu", "timeout", 5),
])
def test_a_first_call_past_its_limit_is_a_row_saying_which(monkeypatch, kernel, device, status, limit):
    limits: list[float] = []
    monkeypatch.setattr(rounds, "Worker", _worker_whose_first_call_hangs(limits))
    (row,) = run_rounds((CaseRun(_case(kernel, device), ("fwd",)),), "unit0")
    assert row["status"] == status and f"timed out after {limit} s" in row["reason"]
    assert ("first call" in row["reason"]) == (status == "compile_timeout")
    assert limits == [limit] and may_compile(_case(kernel, device)) == (status == "compile_timeout")


def test_a_compile_timeout_leaves_the_larger_lengths_to_run():
    small, large = _case("flex", seq_len=4096), _case("flex", seq_len=16384)
    for status, runs_large in (("compile_timeout", True), ("timeout", False)):
        chain = speed_chain([[small], [large]], set(), {}, skip_larger=True)
        first = next(chain)
        rows = [{"case_id": small.case_id, "pass": "fwd", "status": status}]
        second = chain.send(rows)
        assert bool(second.runs) == runs_large and bool(second.skipped) != runs_large, status
    assert dataclasses.replace(small, compile_timeout_s=1).case_id == small.case_id  # not in the id
    assert first.runs[0].case == small


# While one case of a CUDA unit uses the GPU no other case's worker holds GPU memory (docs/gpu.md):
# the driver's side, with recording fake workers (the order of the messages is the protocol).
KERNELS = ("reference", "sdpa", "flex")


DEVICE_COMMANDS = ("warm", "prepare", "time", "probe", "finish")


def unit_case(kernel: str, device: str, passes: tuple[str, ...] = ("fwd", "bwd")) -> Case:
    """A full-attention case of 4K tokens in bfloat16 on ``device`` (the worker tests build it too)."""
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
    runs = tuple(CaseRun(unit_case(k, device), ("fwd", "bwd")) for k in KERNELS)
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
