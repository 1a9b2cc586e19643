"""Which instruction counter works on this machine, and how to run a script under it: callgrind, which
counts on a synthetic CPU (why not ``perf stat``: docs/measurement.md, "Instructions")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

PMU_DIR = Path("/sys/bus/event_source/devices/cpu")
PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
#: the total a callgrind dump reports for its counted region
_SUMMARY = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def perf_problem() -> str | None:
    """Why ``perf stat -e instructions`` cannot count here (one line), or None when it can."""
    if not PMU_DIR.exists():
        return (f"perf stat -e instructions: the kernel exposes no hardware counters ({PMU_DIR} "
                "is missing: no PMU, as in many virtual machines)")
    if shutil.which("perf") is None:
        return "perf stat -e instructions: perf is not installed (apt-get install -y linux-perf)"
    try:
        level = int(PARANOID.read_text().strip())
    except (OSError, ValueError):
        return None
    if level > 2:
        return (f"perf stat -e instructions: kernel.perf_event_paranoid is {level} (needs <= 2 to "
                "count one's own process; setting it needs root)")
    return None


def callgrind_problem() -> str | None:
    """Why callgrind cannot count here (one line), or None when it can."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return "callgrind: valgrind is not installed (apt-get install -y valgrind)"
    import torch  # not at start-up: the CLI checks the counter before it loads torch

    if not torch._C._valgrind_supported_platform():
        return "callgrind: this torch build has no callgrind bindings (torch._C._valgrind_toggle)"
    return None


def no_counter_message() -> str | None:
    """The one-line refusal naming what each counter lacks, or None when callgrind works."""
    problem = callgrind_problem()
    if problem is None:
        return None
    perf = perf_problem() or "perf stat -e instructions: not used by this command"
    return f"count: no instruction counter on this machine: {problem}; {perf}"


def valgrind_version() -> str:
    return subprocess.run(["valgrind", "--version"], capture_output=True, text=True,
                          check=False).stdout.strip()


def run_callgrind(args: list[str], workdir: Path, timeout_s: float, env: dict[str, str]) -> list[int]:
    """The instruction count of each region the script ``args`` toggles on under callgrind, in order."""
    out = workdir / "callgrind.out"
    # no instrumentation until the script asks (start_instrumentation): importing torch runs about 4x faster
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--instr-atstart=no",
               f"--callgrind-out-file={out}", *args]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **env}, check=False)
    if done.returncode:  # the script's own last lines, not callgrind's (==PID== ...)
        own = [line for line in (done.stdout + done.stderr).splitlines()
               if line.strip() and not line.startswith("==")]
        raise RuntimeError(f"the counted script failed (exit {done.returncode}): " + " | ".join(own[-3:]))
    counts = []
    index = 1
    while (dump := workdir / f"callgrind.out.{index}").exists():  # one dump per counted region
        match = _SUMMARY.search(dump.read_text())
        if match is None:
            raise RuntimeError(f"callgrind dump {dump.name} has no summary line")
        counts.append(int(match.group(1)))
        index += 1
    return counts


def start_instrumentation(timeout_s: float = 120.0) -> None:
    """Turn callgrind's instrumentation on for this process (``callgrind_control -i on``).

    Callgrind serves the request between basic blocks of this process, so it spins until the
    control command returns rather than blocking in a system call. ``RuntimeError`` when it fails."""
    control = subprocess.Popen(["callgrind_control", "--instr=on", str(os.getpid())], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while control.poll() is None:  # busy on purpose: see above
        if time.monotonic() > deadline:
            control.kill()
            break
    output = control.communicate()[0].strip()
    if control.returncode != 0 or "OK" not in output:
        raise RuntimeError(f"callgrind_control could not turn instrumentation on: {' | '.join(output.splitlines())}")
