"""The ``relative`` kernel: a relative position bias through torch's CPU flash kernel, exact
against ``reference`` in values and in the gradients of q, k, v and of a learned table."""

from __future__ import annotations

import copy

import pytest
import torch

from attn import create_attention
from attn.call import AttentionCall
from attn.kernels import get_kernel
from attn.kernels import relative as relative_kernel
from attn.kernels.auto import choose_kernel


def _pair(bias: str, heads: int, dtype: torch.dtype, max_distance: int = 5, variant: str = "relative",
          **params):
    """The same module twice (equal tables): on kernel ``relative`` and on ``reference``."""
    torch.manual_seed(0)
    if variant == "relative":
        params.update(bias=bias, max_distance=max_distance)
    else:
        params.update(position_bias=bias, max_distance=max_distance)
    # a mask variant's kernels are its default pattern's (no bias): ``auto`` picks ``relative``
    kernel = "relative" if variant == "relative" else "auto"
    fast = create_attention(variant, num_heads=heads, kernel=kernel, **params).to(dtype)
    if bias == "learned":
        with torch.no_grad():  # a table far from zero, so every offset's gradient matters
            fast.position_bias.table.normal_(0.0, 0.5)
    ref = copy.deepcopy(fast)
    ref.kernel = "reference"
    return fast, ref


def _inputs(batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, dtype: torch.dtype,
            dim: int = 8):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, kv_heads, k_len, dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, kv_heads, k_len, dim, generator=gen, dtype=dtype)
    grad = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=dtype)
    return q, k, v, grad


def _run(module, q, k, v, grad, causal, key_mask):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, causal=causal, key_mask=key_mask)
    out.backward(grad)
    table = None if module.position_bias.kind != "learned" else module.position_bias.table.grad
    return out.detach(), q.grad, k.grad, v.grad, table


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-10, "rtol": 1e-9} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 1e-4}


CASES = [  # (batch, heads, kv_heads, q_len, k_len, max_distance)
    (1, 2, 2, 37, 37, 5),     # not a multiple of any chunk; both tails
    (2, 4, 2, 23, 41, 3),     # GQA, Nq < Nk
    (1, 2, 1, 41, 23, 4),     # Nq > Nk (causal: the first rows see no key)
    (1, 2, 2, 19, 19, 40),    # max_distance beyond the length: all band, no tail
    (1, 2, 2, 300, 300, 7),   # several causal chunks and band blocks
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("bias", ["learned", "alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "keymask"])
@pytest.mark.parametrize("case", CASES, ids=[f"B{c[0]}H{c[1]}/{c[2]}-{c[3]}x{c[4]}-M{c[5]}" for c in CASES])
def test_values_and_gradients_match_reference(case, masked, causal, bias, dtype) -> None:
    batch, heads, kv_heads, q_len, k_len, m = case
    if dtype == torch.float32 and q_len < 300 and (masked or batch > 1):
        pytest.skip("float32 runs the plain and the long shapes (float64 covers the rest)")
    fast, ref = _pair(bias, heads, dtype, m)
    q, k, v, grad = _inputs(batch, heads, kv_heads, q_len, k_len, dtype)
    key_mask = None
    if masked:
        key_mask = torch.rand(batch, k_len, generator=torch.Generator().manual_seed(2)) > 0.3
        key_mask[0, -3:] = False  # padding at the end too
        if batch > 1:
            key_mask[1] = False  # a row with no real key at all: zeros, zero gradients
    got = _run(fast, q, k, v, grad, causal, key_mask)
    want = _run(ref, q, k, v, grad, causal, key_mask)
    assert fast.last_path.kernel == "relative"
    for name, a, b in zip(("out", "dq", "dk", "dv", "dtable"), got, want):
        if b is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a, b, **_tol(dtype), msg=lambda s, n=name: f"{n}: {s}")


@pytest.mark.parametrize("variant", ["full", "causal"])
def test_mask_variants_with_a_position_bias_run_on_it(variant) -> None:
    fast, ref = _pair("learned", 2, torch.float64, 6, variant=variant)
    q, k, v, grad = _inputs(1, 2, 2, 1100, 1100, torch.float64)  # long: auto's long-call order
    got, want = _run(fast, q, k, v, grad, False, None), _run(ref, q, k, v, grad, False, None)
    assert fast.last_path.kernel == "relative"
    assert ("causal" in fast.last_path.path) == (variant == "causal")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_band_and_causal_chunks_cover_long_rows(monkeypatch) -> None:
    """Small chunk sizes, so a short call crosses many chunk and band-block edges."""
    monkeypatch.setattr(relative_kernel, "CAUSAL_ROWS", 16)
    monkeypatch.setattr(relative_kernel, "BAND_ROWS", 8)
    monkeypatch.setattr(relative_kernel, "BAND_ELEMENTS", 2000)  # a few blocks per batched group
    for causal in (False, True):
        fast, ref = _pair("learned", 2, torch.float64, 9)
        q, k, v, grad = _inputs(1, 2, 2, 70, 77, torch.float64)
        for a, b in zip(_run(fast, q, k, v, grad, causal, None), _run(ref, q, k, v, grad, causal, None)):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("dim_v", [4, 12])
def test_value_head_size_may_differ(dim_v) -> None:
    fast, ref = _pair("learned", 2, torch.float64)
    q, k, _, _ = _inputs(1, 2, 2, 30, 30, torch.float64)
    v = torch.randn(1, 2, 30, dim_v, dtype=torch.float64)
    grad = torch.randn(1, 2, 30, dim_v, dtype=torch.float64)
    got, want = _run(fast, q, k, v, grad, False, None), _run(ref, q, k, v, grad, False, None)
    assert got[0].shape == (1, 2, 30, dim_v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_half_precision_is_computed_in_float32() -> None:
    fast, ref = _pair("alibi", 2, torch.float32)
    q, k, v, _ = _inputs(1, 2, 2, 33, 33, torch.bfloat16)
    out = fast(q, k, v)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref(q.float(), k.float(), v.float()), atol=2e-2, rtol=2e-2)


def test_refusals_are_declared() -> None:
    kernel = get_kernel("relative")
    plain = create_attention("full").pattern()
    assert any("no relative position bias" in r for r in kernel.not_supported_reasons(plain))
    windowed = create_attention("sliding_window", window=4, position_bias="alibi", num_heads=2).pattern()
    assert any("also has a mask" in r for r in kernel.not_supported_reasons(windowed))
    pattern = create_attention("relative", bias="alibi", num_heads=2).pattern()
    assert kernel.not_supported_reasons(pattern) == []
    cuda = AttentionCall(torch.device("cuda"), torch.float32)
    assert any("CPU only" in r for r in kernel.not_supported_reasons(pattern, cuda))
    packed = AttentionCall(torch.device("cpu"), torch.float32, q_len=8, k_len=8, has_document_ids=True)
    assert any("document_ids" in r for r in kernel.not_supported_reasons(pattern, packed))


@pytest.mark.parametrize("bias", ["learned", "alibi"])
@pytest.mark.parametrize("variant", ["relative", "full", "causal"])
def test_auto_picks_it_for_a_relative_bias(variant, bias) -> None:
    params = {"bias": bias} if variant == "relative" else {"position_bias": bias}
    att = create_attention(variant, num_heads=2, **params)
    for k_len, kernel in ((64, "sdpa"), (2048, "relative")):  # short calls: sdpa's cached mask
        call = AttentionCall(torch.device("cpu"), torch.float32, requires_grad=True, q_len=k_len, k_len=k_len,
                             has_key_mask=True)
        assert choose_kernel(att.pattern(), call) == kernel
    att.kernel = "relative" if variant == "relative" else "auto"
    q, k, v, _ = _inputs(1, 2, 2, 1100, 1100, torch.float32)
    att(q, k, v)
    assert att.last_path.kernel == "relative"
    assert att.last_path.backend == "flash-cpu"
