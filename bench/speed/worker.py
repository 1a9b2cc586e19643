"""The worker process of one speed case: builds the attention once, then serves commands.

The parent (:mod:`bench.speed.rounds`) sends, pass by pass, and the worker replies:

- ``("warm", pass)``: inputs, support check, warm-up calls (compiles happen here, before the clock)
  -> ``("warmed", info)``;
- ``("prepare", pass)``: the estimate call that sets the repeats, then the memory readings
  -> ``("prepared", info)``;
- ``("time", pass)``: one timed call -> ``("timed", seconds)``;
- ``("probe",)``: the calibration probe -> ``("probed", seconds)``;
- ``("finish", pass)``: kernel path, fallbacks, compile and cache cost -> ``("finished", info)``;
- ``("release",)``: drop inputs and module and empty the CUDA cache, so another case of the unit has
  the device -> ``("released", bytes still reserved)``;
- ``("exit",)``.

A failure replies ``("failed", status, reason)`` and the worker serves the next pass; ``nonfinite``:
the estimate call gave NaN or inf (output, gradients or updated weights). The first message is
``("ready", info)`` or ``("failed", "error", reason)``.
"""

from __future__ import annotations

import gc
import os
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from attn import AttentionCall, create_attention
from attn.devices import synchronize
from attn.kernels import get_kernel, kernel_names
from bench.engine.cache import use_compile_cache
from bench.engine.config import import_plugins
from bench.engine.measure import CallTimer, calibration_probe, measure_memory, start_autograd
from bench.engine.process import failure, limit_memory
from bench.speed.cases import Case
from bench.speed.flops import case_flops
from bench.speed.model_step import ModelStepRunner, build_model, model_flops
from bench.speed.packing import document_ids, document_lengths, padding_mask
from bench.speed.rows import path_columns


class NonFiniteOutput(Exception):
    """The measured call gave NaN or inf values (the message says where)."""


def nonfinite_problem(what: str, tensor: Any) -> str | None:
    """``None`` when ``tensor`` is all finite, else how many NaN and inf values ``what`` has."""
    if tensor is None or not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return None
    nans = int(torch.isnan(tensor).sum())
    infs = int(torch.isinf(tensor).sum())
    return f"{what} has {nans} NaN and {infs} inf values of {tensor.numel()}"


def failed(err: BaseException, case: Case) -> tuple[str, str, str]:
    """``("failed", status, reason)`` for an exception raised while measuring ``case``."""
    if isinstance(err, NonFiniteOutput):
        return "failed", "nonfinite", str(err)[:500]
    return ("failed", *failure(err, case.device, case.max_memory_gb))


class PassRunner:
    """The calls of one pass (fwd, bwd or fwd_bwd) of one built attention module."""

    def __init__(self, case: Case, module: Any, pass_name: str) -> None:
        self.case, self.module, self.pass_name = case, module, pass_name
        self.device = torch.device(case.device)
        self.dtype = getattr(torch, case.dtype)
        b, h, n, d = case.batch, case.heads, case.seq_len, case.head_dim
        grad = pass_name != "fwd"
        self.grad = grad
        gen = torch.Generator(device=self.device).manual_seed(0)  # drawn where they are used
        self.q, self.k, self.v = (
            torch.randn(b, heads, n, d, generator=gen, dtype=torch.float32, device=self.device)
            .to(self.dtype).requires_grad_(grad)  # q (B, H, N, D), k/v (B, H_kv, N, D)
            for heads in (h, case.key_heads, case.key_heads))
        self.d_out = torch.randn(b, h, n, d, generator=gen, device=self.device).to(self.dtype)
        self.key_mask = padding_mask(n, b, case.pad_fraction, self.device) if case.pad_fraction else None
        self.spans: list[tuple[int, int]] = []  # the documents, [start, end)
        self.document_ids = None  # (B, N) for a packed call
        if case.documents:
            lengths = document_lengths(n, case.documents)
            ends = torch.tensor(lengths).cumsum(0).tolist()
            self.spans = list(zip([0, *ends[:-1]], ends, strict=True))
            if not case.one_by_one:
                self.document_ids = document_ids(lengths, b, self.device)
        self.paths: list[Any] = []  # KernelPath of every call of this pass
        self._keep_output = False  # the estimate call keeps its output for the finiteness check
        self._output: Any = None
        self._first_backward: float | None = None  # seconds of the first call's backward
        fn, setup = self._callables()
        self.fn, self.setup = fn, setup
        self.timer = CallTimer(fn, setup, self.device)

    def _forward(self) -> Any:
        if self.case.one_by_one:  # each document its own call, outputs concatenated
            outs = []
            for start, end in self.spans:
                mask = None if self.key_mask is None else self.key_mask[:, start:end]
                outs.append(self.module(self.q[:, :, start:end], self.k[:, :, start:end],
                                        self.v[:, :, start:end], causal=self.case.causal,
                                        key_mask=mask))  # (B, H, n_d, D)
                self.paths.append(self.module.last_path)
            out = torch.cat(outs, dim=2)  # (B, H, N, D)
        else:
            out = self.module(self.q, self.k, self.v, causal=self.case.causal, key_mask=self.key_mask,
                              document_ids=self.document_ids)
            self.paths.append(self.module.last_path)
        if self._keep_output:
            self._output = out.detach()
        return out

    def nonfinite(self) -> str | None:
        """What of the estimate call was NaN or inf: output or a gradient (``None``: all finite)."""
        found = [nonfinite_problem("the output", self._output)]
        if self.grad:
            found += [nonfinite_problem(f"the gradient of {name}", t.grad) for name, t in
                      (("q", self.q), ("k", self.k), ("v", self.v))]
            found += [nonfinite_problem(f"the gradient of parameter {name}", p.grad)
                      for name, p in self.module.named_parameters()]
        return next((f for f in found if f is not None), None)

    def _clear_grads(self) -> None:
        for t in (self.q, self.k, self.v, *self.module.parameters()):
            t.grad = None

    def _callables(self) -> tuple[Any, Any]:
        if self.pass_name == "fwd":
            def forward() -> None:
                with torch.no_grad():
                    self._forward()

            return forward, None
        if self.pass_name == "bwd":
            def forward_again() -> Any:  # untimed: the backward alone is timed
                self._clear_grads()
                return self._forward()

            return (lambda out: out.backward(self.d_out)), forward_again
        # gradients of the previous call are dropped in the untimed setup, before the memory
        # baseline: dropped inside the call they would hide its own gradients' pages
        return (lambda _: self._forward().backward(self.d_out)), self._clear_grads

    def _parts(self) -> tuple[float, float]:
        """One forward and one backward of a grad pass, each timed (seconds, device synchronised)."""
        self._clear_grads()
        start = time.perf_counter()
        out = self._forward()
        synchronize(self.device)
        middle = time.perf_counter()
        out.backward(self.d_out)
        synchronize(self.device)
        return middle - start, time.perf_counter() - middle

    def _call(self) -> tuple[float, float | None]:
        """Seconds of one call as the pass times it, and of its backward alone (None: forward pass)."""
        if not self.grad:
            return self.timer.time_once(), None
        forward_s, backward_s = self._parts()
        return (backward_s if self.pass_name == "bwd" else forward_s + backward_s), backward_s

    def _compiles(self) -> bool:
        """Whether a kernel that compiles code per call shape ran in this pass."""
        names = set(kernel_names())
        return any(get_kernel(p.kernel).compiles_per_shape for p in self.paths
                   if p is not None and p.kernel in names)

    def warm(self) -> dict[str, Any]:
        """The first call and the warm-up, before the pass's clock; raises when unsupported."""
        if self.case.one_by_one:  # the calls of the documents, each alone
            calls = [AttentionCall.from_tensors(self.q[:, :, s:e], self.k[:, :, s:e], self.v[:, :, s:e],
                                                self.case.causal, self.key_mask, self.grad)
                     for s, e in self.spans]
        else:
            calls = [AttentionCall.from_tensors(self.q, self.k, self.v, self.case.causal, self.key_mask,
                                                self.grad, self.document_ids)]
        reasons = list(dict.fromkeys(r for call in calls for r in self.module.not_supported_reasons(call)))
        if reasons:
            raise NotImplementedError("; ".join(reasons))
        first, self._first_backward = self._call()
        for _ in range(self.case.warmup - 1):
            self.timer.time_once()
        return {"first_call_ms": first * 1e3}

    def prepare(self) -> dict[str, Any]:
        """One estimate call and the memory readings, after :meth:`warm`."""
        self._keep_output = True  # a reference kept during the call, checked after it
        try:
            estimate, warm_backward = self._call()
            problem = self.nonfinite()
        finally:
            self._keep_output, self._output = False, None
        if problem is not None:
            raise NonFiniteOutput(f"{problem} ({self.pass_name} pass)")
        memory = measure_memory(self.fn, self.setup, self.device, call_s=estimate)
        return {"estimate_ms": estimate * 1e3,
                "compile_bwd_ms": self._backward_compile_ms(self._first_backward, warm_backward),
                "peak_mem_bytes": memory.peak_bytes, "rss_peak_bytes": memory.rss_peak_bytes}

    def _backward_compile_ms(self, first_s: float | None, warm_s: float | None) -> float | None:
        """First backward less a warm one where a compiling kernel ran (0: none did; None: forward)."""
        if first_s is None or warm_s is None:
            return None
        return max(first_s - warm_s, 0.0) * 1e3 if self._compiles() else 0.0

    def finish(self) -> dict[str, Any]:
        """What ran over the pass's calls: kernel path, fallbacks, compile and cache cost."""
        return path_columns(self.paths, self.case)


def _build(case: Case) -> tuple[Any, dict[str, Any]]:
    """The measured module (or model for ``model_step``) and the case's FLOPs per pass."""
    module = create_attention(case.variant, num_heads=case.heads, head_dim=case.head_dim,
                              kernel=case.kernel, **case.params_dict).to(case.device)
    if case.workload == "model_step":
        flops, flops_kind, density = model_flops(case, module)
        module = build_model(case)
    else:
        flops, flops_kind, density = case_flops(module, batch=case.batch, heads=case.heads,
                                                n=case.seq_len, head_dim=case.head_dim,
                                                causal=case.causal, documents=case.documents)
    return module, {"flops": flops, "flops_kind": flops_kind, "density": density,
                    "threads": torch.get_num_threads()}


def _runner(case: Case, module: Any, pass_name: str) -> Any:
    if case.workload == "model_step":
        return ModelStepRunner(case, module, pass_name)
    return PassRunner(case, module, pass_name)


def _model_step_nonfinite(runner: Any) -> str | None:
    """Non-finite logits of one untimed forward, or weights after a ``train_step`` (``None``: finite)."""
    with torch.no_grad():
        found = nonfinite_problem("the model's output", runner.model(runner.ids))
    if found is None and runner.pass_name == "train_step":
        found = next((f for name, p in runner.model.named_parameters()
                      if (f := nonfinite_problem(f"parameter {name} after the update", p))), None)
    return found


def _prepare(runner: Any) -> dict[str, Any]:
    """The runner's estimate call and memory readings; :class:`NonFiniteOutput` when not finite."""
    info = runner.prepare()
    if isinstance(runner, ModelStepRunner):
        problem = _model_step_nonfinite(runner)
        if problem is not None:
            raise NonFiniteOutput(f"{problem} ({runner.pass_name} pass)")
    return info


def _reserved_bytes(case: Case) -> int:
    """What this process's CUDA allocator reserves (0 for a CPU case)."""
    return int(torch.cuda.memory_reserved()) if case.device == "cuda" else 0


def _serve(case: Case, module: Any, conn: Connection) -> None:
    runner: Any = None
    while True:
        message = conn.recv()
        command = message[0]
        if command == "exit":
            return
        if command == "release":  # another case of the unit is about to use the device
            runner = module = None
            gc.collect()
            if case.device == "cuda":
                torch.cuda.empty_cache()
            conn.send(("released", _reserved_bytes(case)))
            continue
        try:
            if command == "warm":
                runner = None
                if module is None:  # released after an earlier pass
                    module, _ = _build(case)
                runner = _runner(case, module, message[1])
                reply: tuple[Any, ...] = ("warmed", runner.warm())
            elif command == "prepare" and runner is not None:
                reply = ("prepared", _prepare(runner))
            elif command == "time" and runner is not None:
                reply = ("timed", runner.timer.time_once())
            elif command == "probe":
                reply = ("probed", calibration_probe(torch.device(case.device)))
            elif command == "finish" and runner is not None:
                reply = ("finished", runner.finish())
                runner = None
            else:
                reply = ("failed", "error", f"worker: unexpected command {command!r}")
        except Exception as err:
            reply = failed(err, case)
            runner = None
        if case.device == "cuda" and runner is None:
            torch.cuda.empty_cache()
        conn.send(reply)


def worker_main(case_dict: dict[str, Any], cuda_visible: str | None, conn: Connection) -> None:
    """Entry point of a case's process (see the module docstring for the protocol)."""
    if cuda_visible is not None:  # one GPU per local worker slot
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible
    case = Case.from_dict(case_dict)
    use_compile_cache(case.device)
    if case.device == "cpu":  # CUDA reserves huge address space: never cap it there
        limit_memory(case.max_memory_gb)
    if case.threads:
        torch.set_num_threads(case.threads)
    start_autograd()
    try:
        import_plugins(case.plugins)
        module, info = _build(case)
    except Exception as err:  # a broken variant is an error row for every pass
        conn.send(failed(err, case))
        return
    conn.send(("ready", info))
    _serve(case, module, conn)
