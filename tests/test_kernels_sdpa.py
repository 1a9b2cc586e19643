"""The ``sdpa`` kernel records which SDPA backend ran (torch's own choice,
under the backends enabled where it runs) in ``KernelPath.backend`` and the row's
``kernel_path``, and says when a mask forced a slower backend.

On the CPU, torch 2.13 offers two backends: its C++ flash kernel (``flash-cpu``: any float
dtype, with or without an additive mask) and ``math``. CUDA's choice (flash, memory-efficient,
cuDNN) is stood in for by replacing ``torch._fused_sdp_choice``, the function both the
dispatcher and the recorder ask."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn import KernelPath, create_attention
from attn.kernels import sdpa
from bench.speed.rows import kernel_path_text


@pytest.fixture(autouse=True)
def fresh_backend_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdpa, "_backend_cache", OrderedDict())


def _qkv(n: int = 24, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 2, n, 16, generator=gen).to(dtype) for _ in range(3))  # (B, H, N, D)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("name", "params"), [("full", {}), ("causal", {}), ("sliding_window", {"window": 3})])
def test_cpu_calls_record_the_flash_cpu_backend_and_it_is_the_one_that_runs(
        name: str, params: dict[str, Any], dtype: torch.dtype) -> None:
    module = create_attention(name, kernel="sdpa", **params)
    q, k, v = _qkv(dtype=dtype)
    with torch.no_grad():
        out = module(q, k, v)
        assert module.last_path.backend == "flash-cpu"
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # only flash enabled: the same call runs
            torch.testing.assert_close(module(q, k, v), out, atol=0, rtol=0)
        with sdpa_kernel([SDPBackend.MATH]):  # the recorder follows the enabled backends
            module(q, k, v)
            assert module.last_path.backend == "math"


def test_a_key_dim_that_is_not_contiguous_records_math() -> None:
    module = create_attention("full", kernel="sdpa")
    q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in _qkv())  # stride(-1) != 1
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        expected = F.scaled_dot_product_attention(q, k, v)
    with torch.no_grad():
        out = module(q, k, v)
    assert module.last_path.backend == "math"
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_a_mask_that_forces_a_slower_backend_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA's rule, stood in for: flash takes no attn_mask, memory-efficient does
    def cuda_like_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None,
                         is_causal: bool = False, **_: Any) -> int:
        backend = SDPBackend.EFFICIENT_ATTENTION if attn_mask is not None else SDPBackend.FLASH_ATTENTION
        return int(backend)

    monkeypatch.setattr(torch, "_fused_sdp_choice", cuda_like_choice)
    window = create_attention("sliding_window", window=3, kernel="sdpa")
    full = create_attention("full", kernel="sdpa")
    q, k, v = _qkv()
    with torch.no_grad():
        window(q, k, v)
        full(q, k, v)
    assert window.last_path.backend == "memory-efficient (the mask rules out flash-cpu)"
    assert full.last_path.backend == "flash-cpu"  # no mask: nothing forced


def test_the_choice_is_asked_once_per_call_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    real = torch._fused_sdp_choice

    def counting(*args: Any, **kwargs: Any) -> int:
        asked.append(kwargs.get("attn_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_fused_sdp_choice", counting)
    module = create_attention("sliding_window", window=3, kernel="sdpa")
    q, k, v = _qkv()
    with torch.no_grad():
        for _ in range(5):
            module(q, k, v)
    assert asked == [True, False]  # masked, then the same call unmasked; then cached


def test_the_row_names_the_backend_and_old_paths_read_alone() -> None:
    module = create_attention("causal", kernel="sdpa")
    q, k, v = _qkv()
    with torch.no_grad():
        module(q, k, v)
    assert kernel_path_text(module.last_path) == "sdpa(fused, is_causal) [backend: flash-cpu]"
    assert kernel_path_text(KernelPath("blocked", "blocked(band)")) == "blocked(band)"
    assert kernel_path_text(None) == ""
