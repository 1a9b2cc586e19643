"""Test-only variants of known time, memory, deaths and bugs (:data:`TEST_VARIANTS`); never imported by the harness."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any, ClassVar

import torch
from torch import Tensor

from attn import Attention, KernelPath, register_attention
from attn.kernels.reference import dense_attention
from attn.registry import unregister_attention
from attn.validation import Param, invalid


class _Trivial(Attention):
    exact = False

    def native_path(self) -> KernelPath:
        return KernelPath("native", self.name)

    def _output(self, q: Tensor, v: Tensor) -> Tensor:
        return v + 0.0 * q  # (B, H, N, D); gradients flow


@register_attention("bench_sleep", overwrite=True)
class SleepAttention(_Trivial):
    """Test variant: sleeps a known time per forward."""

    def __init__(self, seconds: float = 0.05, **common) -> None:
        super().__init__(**common)
        self.seconds = float(seconds)

    def native_forward(self, q, k, v, causal, key_mask):
        time.sleep(self.seconds)
        return self._output(q, v)


@register_attention("bench_alloc", overwrite=True)
class AllocAttention(_Trivial):
    """Test variant: holds a tensor of a known size (touched) during each forward."""

    def __init__(self, nbytes: int = 64 * 2**20, **common) -> None:
        super().__init__(**common)
        self.nbytes = int(nbytes)

    def native_forward(self, q, k, v, causal, key_mask):
        block = torch.ones(self.nbytes, dtype=torch.uint8, device=q.device)  # touches every page
        out = self._output(q, v) + 0.0 * block[0]
        del block
        return out


@register_attention("bench_fragment", overwrite=True)
class FragmentAttention(_Trivial):
    """Test variant: frees a heap block, maps a fresh one: tensor peak ``3 * mib + 32`` MiB, RSS ``4 * mib + 32``."""

    #: glibc serves a request of at least this size, when no free heap chunk fits it, with mmap
    MMAP_THRESHOLD_MIB = 32
    #: glibc returns the heap's free top to the OS beyond this size
    TRIM_THRESHOLD_MIB = 1

    param_rules: ClassVar[dict[str, Param]] = {"mib": Param(minimum=1)}

    def __init__(self, mib: int = 24, **common) -> None:
        self.check_params(mib=mib)
        super().__init__(**common)
        self.mib = mib
        _pin_malloc_thresholds(self.MMAP_THRESHOLD_MIB * 2**20, self.TRIM_THRESHOLD_MIB * 2**20)

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        if "mib" in params and params["mib"] >= cls.MMAP_THRESHOLD_MIB:
            raise invalid(f"{cls.name}: parameter 'mib'",
                          f"must be below the pinned mmap threshold, {cls.MMAP_THRESHOLD_MIB}; "
                          f"got {params['mib']!r}")
        super().check_together(params)

    @staticmethod
    def mapped_mib(mib: int) -> int:
        """Size of the block allocated after the free: more than all free heap space, so it is mapped."""
        return 2 * mib + 32

    def native_forward(self, q, k, v, causal, key_mask):
        size = self.mib * 2**20
        # `first` and `second` come from the heap; `third` from a fresh mapping, never the hole `first` leaves
        first = torch.ones(size, dtype=torch.uint8, device=q.device)
        second = torch.ones(size, dtype=torch.uint8, device=q.device)  # keeps `first` off the top
        del first  # a hole in the heap: freed, still resident
        third = torch.ones(self.mapped_mib(self.mib) * 2**20, dtype=torch.uint8, device=q.device)
        out = self._output(q, v) + 0.0 * (second[0] + third[0])
        del second, third
        return out


def _pin_malloc_thresholds(mmap_bytes: int, trim_bytes: int) -> None:
    """Fix glibc's mmap and trim thresholds (``mallopt``; also turns off their dynamic adjustment)."""
    m_trim_threshold, m_mmap_threshold = -1, -3
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError) as err:
        raise RuntimeError(f"bench_fragment needs glibc's mallopt: {err}") from err
    for option, value in ((m_mmap_threshold, mmap_bytes), (m_trim_threshold, trim_bytes)):
        if mallopt(option, value) != 1:
            raise RuntimeError(f"bench_fragment: mallopt({option}, {value}) was refused")


class _SleepyBackward(torch.autograd.Function):
    """Identity whose backward sleeps and holds a temporary of a known size."""

    @staticmethod
    def forward(ctx, x: Tensor, seconds: float, nbytes: int) -> Tensor:
        ctx.seconds, ctx.nbytes = seconds, nbytes
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        block = torch.empty(ctx.nbytes, dtype=torch.uint8, device=grad.device)  # no page touched
        time.sleep(ctx.seconds)
        return grad + 0.0 * block[0], None, None


@register_attention("bench_phases", overwrite=True)
class PhasesAttention(_Trivial):
    """Test variant: ``fwd_s``/``bwd_s`` per pass (more on the first) and a ``bwd_nbytes`` backward temporary."""

    def __init__(self, first_s: float = 0.3, fwd_s: float = 0.05, bwd_s: float = 0.08,
                 bwd_nbytes: int = 32 * 2**20, first_bwd_s: float = 0.0, **common) -> None:
        super().__init__(**common)
        self.first_s, self.fwd_s, self.bwd_s = float(first_s), float(fwd_s), float(bwd_s)
        self.bwd_nbytes, self.first_bwd_s = int(bwd_nbytes), float(first_bwd_s)
        self.calls = self.grad_calls = 0

    def native_forward(self, q, k, v, causal, key_mask):
        self.calls += 1
        time.sleep(self.fwd_s + (self.first_s if self.calls == 1 else 0.0))
        if torch.is_grad_enabled() and q.requires_grad:  # the first backward slower (a lazy compile)
            self.grad_calls += 1
        first_bwd = self.first_bwd_s if self.grad_calls == 1 else 0.0
        return _SleepyBackward.apply(self._output(q, v), self.bwd_s + first_bwd, self.bwd_nbytes)


@register_attention("bench_jitter", overwrite=True)
class JitterAttention(_Trivial):
    """Test variant: sleeps ``seconds``, ``seconds * slow`` on every ``every``-th call (a noisy row)."""

    def __init__(self, seconds: float = 0.01, slow: float = 6.0, every: int = 2, **common) -> None:
        super().__init__(**common)
        self.seconds, self.slow, self.every = float(seconds), float(slow), int(every)
        self.calls = 0

    def native_forward(self, q, k, v, causal, key_mask):
        self.calls += 1
        time.sleep(self.seconds * (self.slow if self.calls % self.every == 0 else 1.0))
        return self._output(q, v)


@register_attention("bench_crash", overwrite=True)
class CrashAttention(_Trivial):
    """Test variant: dies in the forward ``how`` it is told; a hanging one writes its pids to ``pidfile``."""

    def __init__(self, how: str = "abort", pidfile: str | None = None, **common) -> None:
        super().__init__(**common)
        self.how = how
        self.pidfile = pidfile

    def _hang(self) -> None:
        pids = [os.getpid()]
        if self.how == "spawn":
            pids.append(subprocess.Popen(["sleep", "1000"]).pid)
        if self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write("\n".join(map(str, pids)) + "\n")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        libc = ctypes.CDLL("libc.so.6")
        while True:
            libc.sleep(3600)  # in C: no Python signal handler runs

    def native_forward(self, q, k, v, causal, key_mask):
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.how == "rt":
            os.kill(os.getpid(), signal.SIGRTMIN + 6)
        elif self.how == "exit":
            os._exit(3)
        elif self.how in ("hang", "spawn"):
            self._hang()
        os.abort()


@register_attention("bench_wrong", overwrite=True)
class WrongAttention(Attention):
    """Test variant: declares a sliding window of 1 but computes full attention (a conformance bug)."""

    def mask_mod(self):
        return lambda b, h, i, j: (i - j).abs() <= 1

    def native_forward(self, q, k, v, causal, key_mask):
        return dense_attention(q, k, v, causal=causal, key_mask=key_mask)  # ignores the window


TEST_VARIANTS = ("bench_sleep", "bench_alloc", "bench_fragment", "bench_phases", "bench_jitter",
                 "bench_crash", "bench_wrong")


def unregister_test_variants() -> None:
    """Remove the test-only variants from the registry (and forget this module)."""
    for name in TEST_VARIANTS:
        unregister_attention(name)
    sys.modules.pop(__name__, None)
