"""Kernels on an accelerator (attn/kernels/base.py): no kernel reads a tensor's value on the host
(a device sync) in its hot path; the chunk sizes of ``blocked`` and ``chunked`` are chosen per
device type; the CPU-written kernels refuse CUDA calls past their fair length (``CUDA_MAX_KEYS``).

A CPU process has no CUDA stream to stall, so the no-sync test stands in for an accelerator by
replacing :func:`attn.kernels.base.host_reads_are_free` (True only on the CPU) with one that
answers False, as it does on CUDA, and records every op that reads a value on the host
(``aten._local_scalar_dense``: ``int(t)``, ``bool(t)``, ``t.item()``; ``aten.nonzero``; a copy to
the CPU) with a ``TorchDispatchMode``, plus any ``Tensor.cpu`` call (a no-op op on CPU tensors)."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attn import AttentionCall, attention_info, create_attention, get_kernel, list_attention
from attn.kernels import auto
from attn.kernels.blocked import forward as blocked_forward
from attn.kernels.blocked.geometry import chunk_elements, geometry
from attn.kernels.chunked import chunk_rows

#: aten ops that read a tensor's value on the host
HOST_READS = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal")


class HostReads(TorchDispatchMode):
    """Records every op that reads a tensor's value on the host, with the attn line that ran it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        to_host = name == "_to_copy" and kwargs.get("device") is not None \
            and torch.device(kwargs["device"]).type == "cpu"
        if name in HOST_READS or to_host:
            self.seen.append(f"{name} at {_attn_line()}")
        return func(*args, **kwargs)


def _attn_line() -> str:
    frames = [f for f in traceback.extract_stack() if "/attn/" in f.filename]
    return f"{frames[-1].filename.rsplit('/attn/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def _recording_cpu(calls: list[str]) -> Any:
    """A ``Tensor.cpu`` that records where it was called from."""
    real = torch.Tensor.cpu

    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(f"Tensor.cpu at {_attn_line()}")
        return real(self, *args, **kwargs)

    return cpu


def _cases() -> list[tuple[str, str]]:
    return [(name, kernel) for name in list_attention() for kernel in attention_info(name).kernels
            if kernel not in ("flex", "xformers")]  # flex compiles (its own test), xformers: CUDA


@pytest.mark.parametrize(("name", "kernel"), _cases(), ids=[f"{n}-{k}" for n, k in _cases()])
def test_no_host_read_in_a_kernel_hot_path_on_an_accelerator(
        name: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    params = attention_info(name).example_params[0]
    module = create_attention(name, kernel=kernel, num_heads=2, head_dim=16, **params)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 200, 16, generator=gen) for _ in range(3))  # (B, H, N, D)
    key_mask = torch.rand(2, 200, generator=gen) > 0.2  # (B, Nk)
    causals = (False, True) if module.supports_causal else (False,)
    for causal in causals:
        for mask in (None, key_mask):
            call = AttentionCall("cpu", torch.float32, causal, True, 200, 200, 16, mask is not None)
            if module.not_supported_reasons(call, kernel=kernel):
                continue
            expected = module(q, k, v, causal=causal, key_mask=mask)  # the CPU path; caches filled
            with monkeypatch.context() as patch:
                for where in ("attn.kernels.base", "attn.kernels.sdpa", "attn.kernels.blocked.forward"):
                    patch.setattr(f"{where}.host_reads_are_free", lambda device: False)
                cpu_calls: list[str] = []
                patch.setattr(torch.Tensor, "cpu", _recording_cpu(cpu_calls))
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                reads = HostReads()
                with reads:
                    out = module(qg, kg, vg, causal=causal, key_mask=mask)
                    out.sum().backward()
            where = f"{name}/{kernel} causal={causal} key_mask={mask is not None}"
            assert reads.seen + cpu_calls == [], where
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=0, msg=where)


def test_blocked_reads_masked_keys_on_the_host_only_where_that_is_free() -> None:
    assert blocked_forward.host_reads_are_free(torch.device("cpu"))
    assert not blocked_forward.host_reads_are_free(torch.device("cuda"))


def test_chunk_sizes_are_chosen_per_device_type() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert chunk_elements(cuda) > chunk_elements(cpu)
    # blocked at N = 512K, w = 128, causal: far fewer chunks per stream on CUDA
    assert geometry(128, True, device=cuda).chunk >= 16 * geometry(128, True, device=cpu).chunk
    assert chunk_rows(1, 8, 1 << 16, cuda) > chunk_rows(1, 8, 1 << 16, cpu)
    assert geometry(128, True, device="meta").chunk == geometry(128, True, device=cpu).chunk


@pytest.mark.parametrize(("kernel", "cap"), [("reference", 16_384), ("chunked", 65_536), ("blocked", 65_536)])
def test_cpu_written_kernels_refuse_cuda_calls_past_their_fair_length(kernel: str, cap: int) -> None:
    pattern = create_attention("sliding_window", num_heads=4, window=8).pattern()

    def reasons(device: str, keys: int) -> list[str]:
        return get_kernel(kernel).not_supported_reasons(
            pattern, AttentionCall(torch.device(device), torch.float32, False, True, keys, keys, 64))

    assert reasons("cuda", cap) == [] and reasons("cpu", 8 * cap) == []
    assert reasons("cuda", cap + 1) == [f"{kernel} is tuned for the CPU; on CUDA it runs up to {cap:,} keys "
                                        f"(this call has {cap + 1:,}), beyond which flex, SDPA or xformers "
                                        "do its work"]
    # auto never reaches for it there; sliding windows take flex
    long_call = AttentionCall(torch.device("cuda"), torch.float32, False, True, 1 << 19, 1 << 19, 64)
    assert auto.choose_kernel(pattern, long_call) == "flex"
