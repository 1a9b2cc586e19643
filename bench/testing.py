"""Test-only attention variants with known cost, for proving the harness's measurements.

Import this module (config key ``plugins: [bench.testing]``) to register:

- ``bench_sleep(seconds)``: sleeps ``seconds`` per forward (known time);
- ``bench_alloc(nbytes)``: allocates and touches ``nbytes`` per forward (known memory);
- ``bench_crash(how)``: dies in the forward: ``abort`` (SIGABRT), ``kill`` (SIGKILL, as the
  OOM killer does) or ``exit`` (exit code 3).

The output is ``v`` (plus ``0 * q`` so gradients flow). Never imported by the harness itself.
"""

from __future__ import annotations

import os
import signal
import time
from typing import ClassVar

import torch
from torch import Tensor

from attn import Attention, KernelPath, register_attention


class _Trivial(Attention):
    kernels: ClassVar[tuple[str, ...]] = ("native",)
    exact = False

    def native_path(self) -> KernelPath:
        return KernelPath("native", self.name)

    def _output(self, q: Tensor, v: Tensor) -> Tensor:
        return v + 0.0 * q  # (B, H, N, D)


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


@register_attention("bench_crash", overwrite=True)
class CrashAttention(_Trivial):
    """Test variant: the process dies during the forward."""

    def __init__(self, how: str = "abort", **common) -> None:
        super().__init__(**common)
        self.how = how

    def native_forward(self, q, k, v, causal, key_mask):
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.how == "exit":
            os._exit(3)
        os.abort()


@register_attention("bench_wrong", overwrite=True)
class WrongAttention(Attention):
    """Test variant: declares a sliding window of 1 but computes full attention (a conformance bug)."""

    kernels: ClassVar[tuple[str, ...]] = ("native",)

    def mask_mod(self):
        return lambda b, h, i, j: (i - j).abs() <= 1

    def native_forward(self, q, k, v, causal, key_mask):
        from attn.kernels.reference import dense_attention

        return dense_attention(q, k, v, causal=causal, key_mask=key_mask)  # ignores the window
