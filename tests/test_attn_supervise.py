"""A process's identity survives pid reuse, and the watchdog takes its child's group down when
the parent it watches is gone. Killing a timed-out worker's group and a killed driver's workers
are tested end to end in test_bench_sweep.py, the kit's children in test_attn_conformance_isolation.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from processes import wait_for

from attn.supervise import alive, identity

ROOT = Path(__file__).resolve().parents[1]


def test_identity_names_a_running_process_and_no_zombie():
    me = identity(os.getpid())
    assert me is not None and me[0] == os.getpid() and identity(os.getpid()) == me
    proc = subprocess.Popen(["true"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert identity(proc.pid) is None and not alive(proc.pid)
    proc.wait()


def test_the_watchdog_kills_its_group_when_the_parents_pid_names_another_process():
    """The parent's pid still runs but started at another time (a reused pid): the watchdog
    kills its own process group, what the child started too."""
    pid, start = identity(os.getpid())
    script = ("import subprocess; from attn.supervise import watch_parent; "
              "print(subprocess.Popen(['sleep', '60']).pid, flush=True); "
              f"watch_parent(({pid}, {start - 1}))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # a group of its own, as a child of attn.supervise has
    grandchild = int(proc.stdout.readline())
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert wait_for(lambda: not alive(grandchild), 10), "the child's own child survived"
