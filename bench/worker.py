"""Running one case in its own process: a crash, an OOM or a timeout becomes rows, not an abort.

The parent (:func:`run_case`) starts a fresh process per case (``forkserver`` with torch
preloaded where available, else ``spawn``), receives one row per finished pass through a
pipe, and kills the process at ``timeout_s``. Passes without a row get ``status`` timeout,
oom (killed by SIGKILL, e.g. the kernel's OOM killer) or error (any other death).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import resource
import signal
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from bench.cases import Case

_OOM_MARKERS = ("can't allocate", "out of memory", "not enough memory", "cannot allocate")
_CONTEXT: Any = None


def _context() -> Any:
    """The multiprocessing context: one forkserver (torch preloaded) per sweep process."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in mp.get_all_start_methods():
            _CONTEXT = mp.get_context("forkserver")
            _CONTEXT.set_forkserver_preload(["torch", "attn", "bench.worker"])
        else:
            _CONTEXT = mp.get_context("spawn")
    return _CONTEXT


def base_row(case: Case, pass_name: str) -> dict[str, Any]:
    """The descriptive columns of a row (before measuring)."""
    return {
        "case_id": case.case_id, "label": case.label, "variant": case.variant,
        "kernel_requested": case.kernel, "kernel": case.kernel,
        "params": case.params_json, "seq_len": case.seq_len, "batch": case.batch,
        "heads": case.heads, "head_dim": case.head_dim, "dtype": case.dtype,
        "device": case.device, "causal": case.causal, "pass": pass_name,
    }


def failure_rows(case: Case, passes: list[str], status: str, reason: str) -> list[dict[str, Any]]:
    """Rows for passes that produced no measurement."""
    return [{**base_row(case, p), "status": status, "reason": reason} for p in passes]


def is_oom(err: BaseException) -> bool:
    """True for an allocation failure (MemoryError, torch's "can't allocate", CUDA OOM)."""
    return isinstance(err, MemoryError) or any(m in str(err).lower() for m in _OOM_MARKERS)


def _limit_memory(max_memory_gb: float | None) -> None:
    """Cap this process's address space (RLIMIT_AS) so a huge CPU case fails as oom."""
    if max_memory_gb is None:
        return
    cap = int(max_memory_gb * 2**30)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _measure_pass(case: Case, module: Any, pass_name: str, device: Any, dtype: Any,
                  flops: dict[str, int]) -> dict[str, Any]:
    """Measure one pass of one built module; returns the measured columns."""
    import torch

    from bench.measure import measure

    b, h, n, d = case.batch, case.heads, case.seq_len, case.head_dim
    grad = pass_name != "fwd"
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float32)  # (B, H, N, D)
               .to(device=device, dtype=dtype).requires_grad_(grad) for _ in range(3))
    reasons = module.supports(device, dtype, case.causal, grad)
    if reasons:
        return {"status": "unsupported", "reason": "; ".join(reasons)}
    d_out = torch.randn(b, h, n, d, generator=gen).to(device=device, dtype=dtype)  # (B, H, N, D)

    paths: list[Any] = []  # KernelPath of every call: compile time and fallbacks of any call

    def forward() -> Any:
        out = module(q, k, v, causal=case.causal)
        paths.append(module.last_path)
        return out

    def clear_grads() -> None:
        for t in (q, k, v, *module.parameters()):
            t.grad = None

    budget = case.time_budget_s
    common = {"device": device, "repeats": case.repeats, "warmup": case.warmup,
              "time_budget_s": budget}
    if pass_name == "fwd":
        with torch.no_grad():
            m = measure(forward, **common)
    elif pass_name == "bwd":
        def setup() -> Any:
            clear_grads()
            return forward()

        m = measure(lambda out: out.backward(d_out), setup=setup, **common)
    else:
        # the previous call's gradients are dropped in the untimed setup, before the memory
        # baseline is read: left to the timed call, they would hide its own gradients' pages
        m = measure(lambda _: forward().backward(d_out), setup=clear_grads, **common)
    path = module.last_path
    seen = [p for p in paths if p is not None]
    compile_s = sum(p.compile_s or 0.0 for p in seen)
    fallbacks = sorted({p.fallback for p in seen if p.fallback})
    time_s = m.median_ms / 1e3
    return {
        "status": "ok", "reason": "",
        "kernel": path.kernel if path else case.kernel,
        "kernel_path": path.path if path else "",
        "mask_emulated": bool(path and path.mask_emulated),
        "fallback": "; ".join(fallbacks),
        "compile_ms": compile_s * 1e3,
        "first_call_ms": m.first_call_s * 1e3,
        "time_ms": m.median_ms, "time_iqr_ms": m.iqr_ms, "repeats": len(m.times_s),
        "peak_mem_bytes": m.peak_bytes,
        "flops": flops[pass_name],
        "tflops": flops[pass_name] / time_s / 1e12 if time_s > 0 else math.nan,
    }


def worker_main(case_dict: dict[str, Any], conn: Connection) -> None:
    """Entry point of the case process: build the case, send one message per pass."""
    from bench.config import import_plugins

    case = Case(**{k: tuple(map(tuple, v)) if k == "params" else
                   (tuple(v) if isinstance(v, list) else v) for k, v in case_dict.items()})
    if case.device == "cpu":  # CUDA reserves huge address space: never cap it there
        _limit_memory(case.max_memory_gb)
    import torch

    from attn import create_attention
    from bench.flops import case_flops

    if case.threads:
        torch.set_num_threads(case.threads)
    import_plugins(case.plugins)
    device = torch.device(case.device)
    dtype = getattr(torch, case.dtype)
    try:
        module = create_attention(case.variant, num_heads=case.heads, head_dim=case.head_dim,
                                  kernel=case.kernel, **case.params_dict).to(device)
        flops, flops_kind, density = case_flops(
            module, batch=case.batch, heads=case.heads, n=case.seq_len, head_dim=case.head_dim,
            causal=case.causal)
    except Exception as err:  # a broken variant is an error row for every pass
        conn.send(("all", {"status": "error", "reason": f"{type(err).__name__}: {err}"}))
        return
    extra = {"flops_kind": flops_kind, "density": density, "threads": torch.get_num_threads()}
    for pass_name in case.passes:
        conn.send(("start", pass_name))
        try:
            result = _measure_pass(case, module, pass_name, device, dtype, flops)
        except NotImplementedError as err:
            result = {"status": "unsupported", "reason": str(err)}
        except Exception as err:
            status = "oom" if is_oom(err) else "error"
            last = traceback.format_exception_only(type(err), err)[-1].strip()
            result = {"status": status, "reason": last[:500]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        conn.send((pass_name, {**extra, **result}))


def _death_status(exitcode: int | None) -> tuple[str, str]:
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode).name
        if -exitcode == signal.SIGKILL:
            return "oom", f"worker killed by {sig} (likely out of memory)"
        return "error", f"worker crashed with {sig}"
    return "error", f"worker exited with code {exitcode} before finishing"


def run_case(case: Case) -> list[dict[str, Any]]:
    """Measure ``case`` in a fresh process; always returns one row per pass."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=worker_main, args=(case.to_dict(), child), daemon=True)
    deadline = time.monotonic() + case.timeout_s
    proc.start()
    child.close()
    rows: dict[str, dict[str, Any]] = {}
    current: str | None = None
    status, reason = "", ""
    try:
        while len(rows) < len(case.passes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                reason = f"timed out after {case.timeout_s:g} s"
                if current:
                    reason += f" in pass {current}"
                break
            if not parent.poll(min(remaining, 0.5)):
                if not proc.is_alive() and not parent.poll(0):
                    proc.join()
                    status, reason = _death_status(proc.exitcode)
                    break
                continue
            try:
                kind, payload = parent.recv()
            except EOFError:
                proc.join()
                status, reason = _death_status(proc.exitcode)
                break
            if kind == "start":
                current = payload
            elif kind == "all":
                rows = {p: payload for p in case.passes}
            else:
                rows[kind] = payload
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    out = []
    for p in case.passes:
        if p in rows:
            out.append({**base_row(case, p), **rows[p]})
        else:
            this_reason = reason if p == current or not current else f"not run: {reason}"
            out.append({**base_row(case, p), "status": status, "reason": this_reason})
    return out


def _peak_main(device: str, dtype: str, threads: int | None, size: int | None,
               conn: Connection) -> None:
    import torch

    from bench.measure import matmul_peak_flops

    if threads:
        torch.set_num_threads(threads)
    conn.send(matmul_peak_flops(torch.device(device), getattr(torch, dtype), size))


def measure_peak(device: str, dtype: str, threads: int | None, size: int | None = None,
                 timeout_s: float = 300) -> float:
    """Matmul peak FLOP/s measured in a fresh worker on ``device`` (NaN if it fails)."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_peak_main, args=(device, dtype, threads, size, child), daemon=True)
    proc.start()
    child.close()
    try:
        return float(parent.recv()) if parent.poll(timeout_s) else math.nan
    except EOFError:
        return math.nan
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
