"""The allocator settings a run records: which variables were set, in a fixed order."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.engine import provenance
from bench.engine.allocator import ALLOCATOR_VARIABLES, KEEP_FREED_MEMORY, SYSTEM_DEFAULT, allocator_settings


def test_no_allocator_variable_reads_as_the_system_default():
    assert allocator_settings({"PATH": "/usr/bin", "MALLOC_TRIM_THRESHOLD_": ""}) == SYSTEM_DEFAULT


def test_set_variables_are_listed_in_a_fixed_order_whatever_the_environment_order():
    environ = {"MALLOC_TRIM_THRESHOLD_": "7", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "HOME": "/root"}
    assert allocator_settings(environ) == "LD_PRELOAD=/usr/lib/libjemalloc.so.2; MALLOC_TRIM_THRESHOLD_=7"


def test_the_kept_memory_settings_are_glibc_variables_this_module_records():
    assert set(KEEP_FREED_MEMORY) <= set(ALLOCATOR_VARIABLES)
    assert allocator_settings(KEEP_FREED_MEMORY) == "; ".join(f"{k}={v}" for k, v in KEEP_FREED_MEMORY.items())


def test_a_run_records_the_settings_its_process_started_with(monkeypatch):
    for name in ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert provenance.environment("cpu", 1, probe=False)["allocator"] == SYSTEM_DEFAULT
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1073741824")
    assert provenance.environment("cpu", 1, probe=False)["allocator"] == "MALLOC_MMAP_THRESHOLD_=1073741824"


@pytest.mark.serial  # counts page faults
def test_glibc_takes_the_kept_memory_settings_and_freed_pages_are_reused():
    """Under KEEP_FREED_MEMORY a freed 64 MiB tensor's pages are reused by the next one (few
    page faults); under glibc's defaults (requests above its largest ``mmap`` threshold, 32
    MiB, always mapped afresh) they are handed back and fault again."""
    script = (
        "import resource, torch\n"
        "torch.set_num_threads(1)\n"  # one arena: the heap settles after a few calls
        "def faults(calls):\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(calls):\n"
        "        torch.ones(1 << 24).sum()\n"  # 64 MiB of float32, freed at once
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "faults(12)\n"
        "print(faults(5))\n"
    )
    def run(extra: dict[str, str]) -> int:
        env = {name: value for name, value in os.environ.items() if name not in ALLOCATOR_VARIABLES}
        out = subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True,
                             text=True, check=True)
        return int(out.stdout.split()[-1])
    default, kept = run({}), run(KEEP_FREED_MEMORY)
    pages = 5 * (64 << 20) // 4096
    assert default > pages // 2  # every tensor faults its pages in again
    assert kept < pages // 20
