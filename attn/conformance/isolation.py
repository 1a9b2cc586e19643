"""The kit's checks in child processes, each under a time limit: the checklist runs in a child that announces each
step; a child that dies or runs past ``timeout_s`` is killed with its process group, its step a FAIL, and a new
child goes on. One time-out retires the kernel, a second the variant (a hanging variant costs about two limits)."""

from __future__ import annotations

import pickle
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from attn.conformance.checklist import Factory, steps
from attn.conformance.harness import (
    active_dtypes,
    dtypes_from,
    enter_profile,
    typed_copies,
)
from attn.conformance.report import CheckResult, ConformanceReport
from attn.registration import REGISTRY, register_attention
from attn.supervise import Child, ChildGone, signal_name

#: default time limit of one check, in seconds (``attn-bench check --timeout-s``)
CHECK_TIMEOUT_S = 300.0
#: time-outs after which the kit calls the variant no more (the first gives up its kernel)
MAX_TIMEOUTS = 2
#: how long a child that finished its steps gets to exit by itself before it is killed
EXIT_GRACE_S = 10.0


@dataclass(frozen=True)
class Job:
    """What a child needs to run the checklist from step ``start`` on (picklable)."""

    attention: str | Factory
    registered: Factory | None  # the object registered under a name, registered again there
    params: Any
    kernels: tuple[str, ...] | None
    device: str
    seed: int
    quick: bool
    dtypes: tuple[str, ...] | None = None  # the dtypes checked, by name; None: the exact ones
    start: int = 0
    crashed: frozenset[int] = frozenset()  # steps whose child died: not run again
    timed_out: tuple[tuple[str, str], ...] = ()  # (kernel, check) of each step out of time

    def not_run(self, kernel: str) -> str | None:
        """Why a step on ``kernel`` is not run after earlier time-outs, or None."""
        if len(self.timed_out) >= MAX_TIMEOUTS:
            return (f"not run: {len(self.timed_out)} checks timed out "
                    f"({', '.join(f'{c} on {k}' for k, c in self.timed_out)}); the kit calls this variant no more")
        check = dict(self.timed_out).get(kernel)
        return None if check is None else (f"not run: check {check} timed out on kernel {kernel!r}; "
                                           "the kit calls that kernel no more")


def sendable(attention: str | Factory) -> tuple[Factory | None, str | None]:
    """``(object to send, None)`` for ``attention``, or ``(None, why it cannot be sent)``."""
    target = REGISTRY.entries.get(attention) if isinstance(attention, str) else attention
    if target is None:
        return None, None  # unknown name: the child reports it like the parent would
    try:
        pickle.dumps(target)
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"
    return target, None


def _child_main(job: Job, conn: Any) -> None:
    """Entry point of a child: run the steps of ``job`` and send each one's results."""
    enter_profile(job.quick)
    active_dtypes.set(dtypes_from(job.dtypes))
    typed_copies.set(weakref.WeakKeyDictionary())
    try:
        if isinstance(job.attention, str) and job.registered is not None \
                and REGISTRY.entries.get(job.attention) is not job.registered:
            register_attention(job.attention, overwrite=True)(job.registered)
        for step in steps(job.attention, job.params, job.kernels, torch.device(job.device),
                          job.seed, job.quick):
            if step.index in job.crashed:
                continue
            if step.index < job.start:
                if step.check == "construct":
                    step.run()  # the module the steps after it need
                continue
            reason = job.not_run(step.kernel)
            if reason is not None:
                conn.send(("results", step.index, [CheckResult(step.check, step.kernel, step.params,
                                                               "skip", reason)]))
                continue
            conn.send(("start", step.index, step.check, step.kernel, step.params))
            conn.send(("results", step.index, step.run()))
    except Exception as err:  # outside any check: the kit could not run here
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("done",))


def death_cause(exitcode: int | None) -> str:
    """How a child that did not finish its check ended, in words."""
    if exitcode is not None and exitcode < 0:
        return f"the check's process was killed by {signal_name(-exitcode)}"
    if exitcode:
        return (f"the check's process exited with code {exitcode} before the check finished "
                "(the variant ended the process)")
    return "the check's process ended before the check finished"


@dataclass(frozen=True)
class _Cut:
    """A step that did not finish: which, and why."""

    index: int | None
    check: str
    kernel: str
    params: dict[str, Any]
    cause: str
    timed_out: bool = False


def _run_child(job: Job, timeout_s: float | None, report: ConformanceReport,
               on_start: Callable[[str, str, dict[str, Any]], None] | None = None) -> _Cut | None:
    """Run ``job`` in one child, results into ``report``; None when every step finished, else the cut step."""
    child = Child(_child_main, (job,))
    current = _Cut(None, "kit", "-", {}, "")
    limit = float("inf") if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    try:
        while True:
            try:
                message = child.receive(deadline - time.monotonic())
            except TimeoutError:
                return replace(current, timed_out=True, cause=f"did not finish within {timeout_s:g} s "
                                                              "(the per-check limit); its process was killed")
            except ChildGone:
                break
            if message[0] == "start":
                current = _Cut(*message[1:], cause="")
                if on_start is not None:
                    on_start(current.check, current.kernel, current.params)
                deadline = time.monotonic() + limit
            elif message[0] == "results":
                report.add(message[2])
                current = _Cut(None, "kit", "-", {}, "")
            elif message[0] == "error":
                return _Cut(None, "kit", "-", {}, f"the kit could not run in its process: {message[1]}")
            else:  # done: let it exit by itself (killed, its compile workers' semaphores leak)
                child.process.join(EXIT_GRACE_S)
                return None
        cause = death_cause(child.process.exitcode)
        if current.index is None:
            return replace(current, cause=f"{cause}, outside any check (the kit's process could not "
                                          "start or go on; isolate=False checks in the calling process)")
        return replace(current, cause=cause)
    finally:
        child.kill()
        child.conn.close()


def run_isolated(job: Job, name: str, timeout_s: float | None,
                 on_result: Callable[[CheckResult], None] | None = None,
                 on_start: Callable[[str, str, dict[str, Any]], None] | None = None
                 ) -> ConformanceReport:
    """Every step of ``job`` in child processes, each under ``timeout_s`` seconds (None: no limit).

    A step whose process died or timed out is a FAIL; time-outs retire a kernel, then the variant
    (:meth:`Job.not_run`). ``on_result`` gets each result, ``on_start`` each ``(check, kernel, params)``."""
    report = ConformanceReport(name, on_result=on_result)
    while True:
        cut = _run_child(job, timeout_s, report, on_start)
        if cut is None:
            return report
        report.add([CheckResult(cut.check, cut.kernel, cut.params, "fail", cut.cause)])
        if cut.index is None:  # outside any check: nothing to go on with
            return report
        timed_out = (*job.timed_out, (cut.kernel, cut.check)) if cut.timed_out else job.timed_out
        job = replace(job, start=cut.index + 1, crashed=job.crashed | {cut.index}, timed_out=timed_out)
