"""The CPU a measured figure holds for: model, vendor, torch's dispatch level, instruction-set flags and BLAS.

Here rather than in ``bench`` because ``auto`` (:mod:`attn.kernels.tuning`) checks a tuning file
against it, and ``attn`` imports nothing of ``bench``; ``bench.engine.provenance`` records the
same fields in every run's ``env.json``.
"""

from __future__ import annotations

import platform
from pathlib import Path

#: instruction-set flags of /proc/cpuinfo that decide which CPU kernels torch and its BLAS run
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_identity() -> dict[str, str]:
    """The CPU a run's figures hold for: model, vendor, torch's dispatch level, :data:`CPU_FLAGS` and BLAS."""
    import torch

    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown")
    return {"cpu_model": cpu_name(), "cpu_vendor": fields.get("vendor_id", platform.machine()),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": " ".join(f for f in CPU_FLAGS if f in flags), "blas": blas}
