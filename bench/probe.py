"""The device probe: what one short call on a borrowed GPU must bring back, phase by phase.

``.ci/gpu-probe`` (docs/gpu.md): each phase in a child process, a JSON line as it ends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attn import create_attention
from attn.devices import synchronize
from attn.supervise import Child, ChildGone
from bench.engine.cache import use_compile_cache
from bench.engine.measure import start_autograd

#: the patterns timed through flex: (label, variant, parameters)
BANDED = (("sliding_window", "sliding_window", {"window": 256}),
          ("dilated", "dilated", {"window": 128, "dilation": 2}),
          ("global_tokens", "global_tokens", {"window": 256, "num_global": 16}))
REPEATS = 5


@dataclass(frozen=True)
class Shape:
    """The call shape of a phase: (B, H, N, D) and the dtype."""

    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype: torch.dtype

    def inputs(self, device: torch.device, grad: bool) -> tuple[torch.Tensor, ...]:
        """q, k, v and a gradient for the output, drawn on ``device``."""
        gen = torch.Generator(device=device).manual_seed(0)
        size = (self.batch, self.heads, self.seq_len, self.head_dim)
        q, k, v = (torch.randn(size, generator=gen, device=device, dtype=self.dtype).requires_grad_(grad)
                   for _ in range(3))  # (B, H, N, D) each
        return q, k, v, torch.randn(size, generator=gen, device=device, dtype=self.dtype)


def _timed(fn: Callable[..., Any], device: torch.device, *args: Any) -> tuple[float, Any]:
    """Seconds of ``fn(*args)`` on an idle device, and its result."""
    synchronize(device)
    start = time.perf_counter()
    result = fn(*args)
    synchronize(device)
    return time.perf_counter() - start, result


def _steady(module: Any, shape: Shape, device: torch.device, grad: bool) -> dict[str, Any]:
    """First-call parts (mask build, forward compile, backward compile) and steady times."""
    q, k, v, d_out = shape.inputs(device, grad)
    first_fwd, out = _timed(lambda: module(q, k, v), device)
    path = module.last_path
    row = {"kernel_path": path.path, "fallback": path.fallback, "first_forward_s": first_fwd,
           "mask_build_s": path.setup_s, "forward_compile_s": path.compile_s}
    forwards, backwards = [], []
    first_bwd = _timed(out.backward, device, d_out)[0] if grad else None
    for _ in range(REPEATS):
        with torch.set_grad_enabled(grad):
            seconds, out = _timed(lambda: module(q, k, v), device)
        forwards.append(seconds)
        if grad:
            backwards.append(_timed(out.backward, device, d_out)[0])
    row["steady_forward_ms"] = statistics.median(forwards) * 1e3
    if grad:
        row["steady_backward_ms"] = statistics.median(backwards) * 1e3
        row["backward_compile_s"] = max(first_bwd - statistics.median(backwards), 0.0)
    return row


def versions(device: torch.device, quick: bool) -> dict[str, Any]:
    """torch, Triton, CUDA and the device; the compile cache and how much it holds."""
    cache = Path(use_compile_cache(device.type))
    files = sum(1 for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    row: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "compile_cache": str(cache), "compile_cache_files": files}
    if device.type == "cuda":
        row.update(device_name=torch.cuda.get_device_name(device),
                   capability=list(torch.cuda.get_device_capability(device)))
    return row


def _shape(device: torch.device, quick: bool, n: int) -> Shape:
    return Shape(1, 16 if not quick else 4, n, 64, torch.bfloat16 if device.type == "cuda" else torch.float32)


def sdpa(device: torch.device, quick: bool) -> dict[str, Any]:
    """Full and causal attention through SDPA, forward and backward, at both lengths."""
    rows = {}
    for n in _lengths(quick):
        for name in ("full", "causal"):
            rows[f"{name}_{n}"] = _steady(create_attention(name, kernel="sdpa"), _shape(device, quick, n), device, True)
    return rows


def nystrom(device: torch.device, quick: bool) -> dict[str, Any]:
    """Nystrom-64 against SDPA at the shorter length (interleaved), and the profiler's summary of one Nystrom call."""
    shape = _shape(device, quick, _lengths(quick)[0])
    nys = create_attention("nystrom", num_landmarks=64, num_heads=shape.heads)
    full = create_attention("full", kernel="sdpa")
    q, k, v, d_out = shape.inputs(device, grad=True)

    def step(module: Any) -> float:
        return _timed(lambda: module(q, k, v).backward(d_out), device)[0]

    step(nys), step(full)  # warm
    ratios = [step(full) / step(nys) for _ in range(REPEATS)]  # > 1: Nystrom is faster
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step(nys)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return {"speedup_over_sdpa_median": statistics.median(ratios), "speedup_min": min(ratios),
            "speedup_max": max(ratios), "kernel_path": nys.last_path.path,
            "profile_ops": sum(e.count for e in events),
            "profile_top": [{"name": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3}
                            for e in events[:12]]}


def banded(label: str, n: int) -> Callable[[torch.device, bool], dict[str, Any]]:
    """The phase timing ``label`` through flex at length ``n`` (a backward on CUDA only)."""
    variant, params = next((v, p) for name, v, p in BANDED if name == label)

    def phase(device: torch.device, quick: bool) -> dict[str, Any]:
        return _steady(create_attention(variant, kernel="flex", **params), _shape(device, quick, n), device,
                       grad=device.type == "cuda")

    return phase


def _lengths(quick: bool) -> tuple[int, int]:
    return (1024, 2048) if quick else (16384, 65536)


def phases(quick: bool) -> list[tuple[str, Callable[[torch.device, bool], dict[str, Any]], float]]:
    """``(name, function, time limit in s)`` in the order they run."""
    out = [("versions", versions, 60.0), ("sdpa", sdpa, 120.0), ("nystrom", nystrom, 90.0)]
    for n in _lengths(quick)[-1:] if quick else _lengths(quick):  # quick: flex compiles each; one length shows it runs
        out += [(f"flex_{label}_{n}", banded(label, n), 150.0) for label, _, _ in BANDED]
    return out


def _phase_main(index: int, device: str, quick: bool, conn: Any) -> None:
    """Child entry: run phase ``index`` and send its row (or the error)."""
    use_compile_cache(device)
    start_autograd()
    _, fn, _ = phases(quick)[index]
    try:
        conn.send({"status": "ok", **fn(torch.device(device), quick)})
    except Exception as err:
        conn.send({"status": "error", "reason": f"{type(err).__name__}: {err}"[:500]})


def run(device: str, quick: bool, budget_s: float, write: Callable[[dict[str, Any]], None]) -> None:
    """Every phase in a child under ``min(its limit, budget left)``, each row written as it ends."""
    deadline = time.monotonic() + budget_s
    for index, (name, _, limit) in enumerate(phases(quick)):
        left = deadline - time.monotonic()
        if left <= 1:
            write({"phase": name, "status": "skipped", "reason": f"the {budget_s:g} s budget is spent"})
            continue
        start = time.monotonic()
        child = Child(_phase_main, (index, device, quick))
        try:
            row = child.receive(min(limit, left))
        except TimeoutError:
            row = {"status": "timeout", "reason": f"still running after {min(limit, left):.0f} s"}
        except ChildGone:
            row = {"status": "error", "reason": f"the phase's process died (exit {child.process.exitcode})"}
        finally:
            child.kill()
        write({"phase": name, "device": device, "elapsed_s": round(time.monotonic() - start, 2), **row})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small lengths (1K, 2K): a test of the phases")
    parser.add_argument("--budget-s", type=float, default=540.0, help="all phases together (default 540)")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: 'cuda' is not available here; allowed values: cpu")

    def write(row: dict[str, Any]) -> None:
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(line + "\n")

    run(args.device, args.quick, args.budget_s, write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
