"""The ``blocked`` kernel against the dense reference: values, gradients, edges, O(N*w) memory."""

from __future__ import annotations

import pytest
import torch

from attn import Band, create_attention
from attn.kernels.blocked import blocked_attention
from attn.kernels.reference import dense_attention
from attn.position_bias import RelativePositionBias
from attn.variants.dilated import dilated_mod
from attn.variants.global_tokens import global_tokens_mod
from attn.variants.sliding_window import sliding_window_mod

BANDS = [
    Band(0), Band(3), Band(16), Band(17), Band(40),
    Band(2, dilation=2), Band(1, dilation=3), Band(0, dilation=4), Band(5, dilation=2),
    Band(3, num_global=1), Band(0, num_global=3), Band(2, num_global=5),
]
SHAPES = [(37, 37), (64, 64), (65, 65), (1, 50), (5, 41), (3, 3)]  # (Nq, Nk)


def mask_of(band: Band):
    if band.num_global:
        return global_tokens_mod(band.num_global, band.window)
    if band.dilation > 1:
        return dilated_mod(band.window, band.dilation)
    return sliding_window_mod(band.window)


def inputs(nq: int, nk: int, dtype=torch.float64, batch=2, heads=3, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, nq, dim, generator=gen, dtype=dtype).requires_grad_()
    k = torch.randn(batch, heads, nk, dim, generator=gen, dtype=dtype).requires_grad_()
    v = torch.randn(batch, heads, nk, dim + 1, generator=gen, dtype=dtype).requires_grad_()
    return q, k, v


def compare(band, nq, nk, causal, key_mask, score_mod=None, params=(), dtype=torch.float64,
            atol=1e-10, block=None, chunk=None):
    q, k, v = inputs(nq, nk, dtype)
    out = blocked_attention(q, k, v, band, causal=causal, key_mask=key_mask, score_mod=score_mod,
                            block=block, chunk=chunk)
    ref = dense_attention(q, k, v, mask_mod=mask_of(band), score_mod=score_mod, causal=causal,
                          key_mask=key_mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=atol, rtol=0)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), [q, k, v, *params])
    ref_grads = torch.autograd.grad((ref * weight).sum(), [q, k, v, *params])
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, atol=atol * 10, rtol=0)


@pytest.mark.parametrize("band", BANDS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference_with_gradients(band: Band, causal: bool) -> None:
    for nq, nk in SHAPES:
        compare(band, nq, nk, causal, None)


@pytest.mark.parametrize("band", [Band(3), Band(2, dilation=2), Band(2, num_global=2)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_key_mask_and_empty_rows(band: Band, causal: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    key_mask = torch.rand(2, 45, generator=gen) > 0.4
    key_mask[1] = False  # every row of batch 1 has no key: zeros, never NaN
    compare(band, 45, 45, causal, key_mask)
    compare(band, 7, 45, causal, key_mask)


@pytest.mark.parametrize("nq", [7, 45])  # the key-span path (one query block) and the blocked loop
@pytest.mark.parametrize("band", [Band(3), Band(2, dilation=2), Band(2, num_global=2)], ids=str)
def test_rows_with_no_key_pass_any_gradient_back_as_zero(band: Band, nq: int) -> None:
    """An empty row's output is 0 whatever its keys, so its gradient must be 0 even when the
    upstream gradient is large (it was NaN: the row was divided by a tiny clamp)."""
    q, k, v = inputs(nq, 45)
    key_mask = torch.zeros(2, 45, dtype=torch.bool)
    key_mask[0] = True
    out = blocked_attention(q, k, v, band, causal=False, key_mask=key_mask)
    weight = torch.full_like(out, 8.0)
    grads = torch.autograd.grad((out * weight).sum(), [q, k, v])
    for grad in grads:
        assert torch.isfinite(grad).all()
        assert not grad[1].any()  # batch 1 has no key at all


@pytest.mark.parametrize("kind", ["learned", "alibi"])
@pytest.mark.parametrize("band", [Band(4), Band(2, dilation=3), Band(3, num_global=2)], ids=str)
def test_position_bias_on_the_band(kind: str, band: Band) -> None:
    bias = RelativePositionBias(kind, 3, 6).double()
    params = tuple(bias.parameters())
    for causal in (False, True):
        compare(band, 50, 50, causal, None, bias.score_mod(), params)
        compare(band, 9, 50, causal, None, bias.score_mod(), params)


@pytest.mark.parametrize("block", [*(pytest.param(b, marks=pytest.mark.slow) for b in (16, 32)), 64])  # 64: benchmarked
def test_block_sizes_and_float32(block: int) -> None:
    for nq in (100, 129, 257):
        compare(Band(20), nq, nq, False, None, dtype=torch.float32, atol=1e-5, block=block)
        compare(Band(33), nq, nq, True, None, dtype=torch.float32, atol=1e-5, block=block)


@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 3])  # chunk=1: the most chunks, 3x as long
@pytest.mark.parametrize("band", [Band(5), Band(3, dilation=3), Band(4, num_global=3)], ids=str)
def test_many_chunks_interior_views_and_local_key_masks(band: Band, chunk: int) -> None:
    """Long enough for interior blocks (read through strided views) between the padded end
    blocks, cut into several chunks; masked keys in one region only, so some chunks carry the
    key bias and others skip it."""
    key_mask = torch.ones(2, 230, dtype=torch.bool)
    key_mask[0, 100:111] = False
    key_mask[1, 7] = False
    bias = RelativePositionBias("learned", 3, 9).double()
    for causal in (False, True):
        compare(band, 230, 230, causal, key_mask, block=16, chunk=chunk)
        compare(band, 150, 230, causal, None, bias.score_mod(), tuple(bias.parameters()), block=16,
                chunk=chunk)


@pytest.mark.parametrize("band", [Band(5), Band(16), Band(3, dilation=3), Band(4, num_global=3)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_interior_chunks_through_the_flash_kernel_match_the_reference(band: Band, causal: bool, monkeypatch) -> None:
    """With one head size (D == Dv) the interior chunks run torch's CPU flash kernel (forward
    and backward); edge chunks, chunks with a masked key and the global columns keep the
    generic path. Values and gradients against the dense reference, in float64 and float32,
    with grouped key heads; the flash path must have run."""
    from attn.kernels.blocked import backward, flash, forward

    calls = {"forward": 0, "backward": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(forward, "flash_forward_chunk", counted("forward", flash.flash_forward_chunk))
    monkeypatch.setattr(backward, "flash_backward_chunk", counted("backward", flash.flash_backward_chunk))
    gen = torch.Generator().manual_seed(5)
    key_mask = torch.ones(2, 200, dtype=torch.bool)
    key_mask[1, 90:95] = False  # some chunks of batch element 1 carry the key bias
    for dtype, atol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        q = torch.randn(2, 4, 200, 8, generator=gen, dtype=dtype).requires_grad_()
        k, v = (torch.randn(2, 2, 200, 8, generator=gen, dtype=dtype).requires_grad_() for _ in range(2))
        out = blocked_attention(q, k, v, band, causal=causal, key_mask=key_mask, block=16, chunk=2)
        ref = dense_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask_mod=mask_of(band),
                              causal=causal, key_mask=key_mask)
        torch.testing.assert_close(out, ref, atol=atol, rtol=0)
        weight = torch.randn(out.shape, generator=gen, dtype=dtype)
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=atol * 10, rtol=0)
    if band.num_global:  # every row also reads the global columns: the generic path throughout
        assert calls == {"forward": 0, "backward": 0}
    else:
        assert calls["forward"] > 0 and calls["backward"] > 0, calls


def test_the_path_says_when_interior_chunks_can_take_the_flash_kernel() -> None:
    q = torch.randn(1, 2, 256, 8)
    note = "interior chunks without a masked key through the CPU flash kernel"
    window = create_attention("sliding_window", window=16, kernel="blocked")
    window(q, q, q)
    assert note in window.last_path.path
    window(q, q, q[..., :4])  # two head sizes: the generic path only
    assert note not in window.last_path.path
    globals_ = create_attention("global_tokens", window=16, num_global=2, kernel="blocked")
    globals_(q, q, q)
    assert note not in globals_.last_path.path


@pytest.mark.parametrize("band", [Band(3), Band(2, dilation=3), Band(3, num_global=2)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_few_rows_take_the_key_span_and_both_paths_agree(band: Band, causal: bool) -> None:
    """Rows that fit in one block (KV-cache decoding) use one dense product over the keys the
    band reaches; the per-stream block path gives the same values and gradients."""
    from attn.kernels import blocked

    gen = torch.Generator().manual_seed(4)
    key_mask = torch.rand(2, 41, generator=gen) > 0.3
    bias = RelativePositionBias("alibi", 3, 6).double()
    for nq in (1, 5):
        q, k, v = inputs(nq, 41)
        assert blocked.uses_key_span(nq, band)
        span = blocked_attention(q, k, v, band, causal=causal, key_mask=key_mask,
                                 score_mod=bias.score_mod())
        rows = blocked.global_rows(nq, 41, band.num_global)
        assert rows == 0  # positions 36..40 are past the global tokens
        streamed = blocked.banded_attention(q, k, v, band, causal=causal, q_offset=41 - nq,
                                            key_mask=key_mask, score_mod=bias.score_mod(), block=None,
                                            chunk=None)
        ref = dense_attention(q, k, v, mask_mod=mask_of(band), score_mod=bias.score_mod(),
                              causal=causal, key_mask=key_mask)
        torch.testing.assert_close(span, ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(streamed, ref, atol=1e-10, rtol=0)
        weight = torch.randn_like(ref)
        ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
        for out in (span, streamed):
            grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
            for got, want in zip(grads, ref_grads):
                torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_window_boundary_is_inclusive() -> None:
    """|i - j| == w is allowed, w + 1 is not (docs/variants.md), probed with one-hot values."""
    w, n = 5, 40
    q = torch.zeros(1, 1, n, 4, dtype=torch.float64)
    k = torch.zeros(1, 1, n, 4, dtype=torch.float64)
    v = torch.eye(n, dtype=torch.float64).view(1, 1, n, n)
    out = blocked_attention(q, k, v, Band(w))[0, 0]  # uniform over the allowed keys
    allowed = out > 0
    i = torch.arange(n).view(-1, 1)
    j = torch.arange(n).view(1, -1)
    assert torch.equal(allowed, (i - j).abs() <= w)


def test_kernel_through_registry_and_decoding() -> None:
    """KV-cache decoding (Nq=1, causal) through create_attention; path recorded."""
    for name, params in [("sliding_window", {"window": 8}), ("dilated", {"window": 3, "dilation": 2}),
                         ("global_tokens", {"window": 4, "num_global": 2})]:
        module = create_attention(name, kernel="blocked", **params).double()
        ref = create_attention(name, kernel="reference", **params).double()
        q, k, v = inputs(1, 77)
        torch.testing.assert_close(module(q, k, v, causal=True), ref(q, k, v, causal=True),
                                   atol=1e-10, rtol=0)
        assert module.last_path.kernel == "blocked"
        assert not module.last_path.mask_emulated and module.last_path.fallback is None
        assert "key span" in module.last_path.path


def test_more_queries_than_keys_falls_back_exactly() -> None:
    """Rows at negative positions follow each variant's own rule; computed densely, flagged."""
    module = create_attention("global_tokens", kernel="blocked", num_global=0, window=4).double()
    ref = create_attention("global_tokens", kernel="reference", num_global=0, window=4).double()
    q, k, v = inputs(41, 23)
    torch.testing.assert_close(module(q, k, v), ref(q, k, v), atol=1e-10, rtol=0)
    assert "negative positions" in module.last_path.fallback


def test_no_n_by_n_tensor_at_300k() -> None:
    """N = 300,000: an N x N fp32 matrix is 360 GB; forward and backward must not build one."""
    n = 300_000
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen).requires_grad_() for _ in range(3))
    for band in (Band(4), Band(2, dilation=3), Band(4, num_global=2)):
        out = blocked_attention(q, k, v, band, causal=False)
        assert out.shape == (1, 1, n, 16) and torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
        q.grad = k.grad = v.grad = None
    # spot-check a few rows against the dense rule on their band
    with torch.no_grad():
        out = blocked_attention(q, k, v, Band(4))
        for row in (0, 12345, n - 1):
            lo, hi = max(row - 4, 0), min(row + 5, n)
            s = (q[0, 0, row] @ k[0, 0, lo:hi].T) / 4.0
            torch.testing.assert_close(out[0, 0, row], torch.softmax(s, -1) @ v[0, 0, lo:hi],
                                       atol=1e-5, rtol=0)


def test_non_contiguous_head_split_inputs() -> None:
    """Models split heads with a transpose: (B, N, H, D) -> (B, H, N, D), not contiguous."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 70, 3, 8, generator=gen, dtype=torch.float64)  # (B, N, H, D)
    q = k = v = x.transpose(1, 2)
    for band in (Band(5), Band(2, dilation=2), Band(3, num_global=2)):
        for nq in (70, 1):
            out = blocked_attention(q[:, :, -nq:], k, v, band, causal=True)
            ref = dense_attention(q[:, :, -nq:], k, v, mask_mod=mask_of(band), causal=True)
            torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_global_tokens_cost_the_memory_of_a_sliding_window(causal: bool) -> None:
    """The global rows run inside the banded core, into its output, and add their key and
    value gradients in place: forward+backward of global tokens allocates what the sliding
    window does (tensor allocations counted by the profiler, a deterministic count), where
    concatenating a separately computed dense part cost 1.7x."""
    from bench.engine.measure import tensor_peak_bytes_cpu

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 4096, 32, generator=gen).requires_grad_() for _ in range(3))

    def peak(band: Band) -> int:
        def call() -> None:
            blocked_attention(q, k, v, band, causal=causal).sum().backward()
            q.grad = k.grad = v.grad = None
        return tensor_peak_bytes_cpu(call)

    sliding, global_tokens = peak(Band(64)), peak(Band(64, num_global=16))
    assert global_tokens <= 1.05 * sliding, (global_tokens, sliding)


def test_global_rows_with_a_learned_bias_grouped_heads_and_padding() -> None:
    """Global rows inside the core: a learned position bias (its table's gradient), grouped
    key heads and padded keys at once, against the dense reference."""
    heads, kv_heads, n = 4, 2, 70
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, heads, n, 8, generator=gen, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(2, kv_heads, n, 8, generator=gen, dtype=torch.float64).requires_grad_()
            for _ in range(2))
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[1, -9:] = False
    key_mask[0, 1] = False  # a padded global key
    for causal in (False, True):
        module = create_attention("global_tokens", kernel="blocked", num_global=3, window=5,
                                  num_heads=heads, position_bias="learned", max_distance=8).double()
        ref = create_attention("global_tokens", kernel="reference", num_global=3, window=5,
                               num_heads=heads, position_bias="learned", max_distance=8).double()
        with torch.no_grad():
            for p in module.parameters():
                p.normal_(generator=gen)
        ref.load_state_dict(module.state_dict())
        out = module(q, k, v, causal=causal, key_mask=key_mask)
        expected = ref(q, k, v, causal=causal, key_mask=key_mask)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
        assert "g=3" in module.last_path.path and module.last_path.fallback is None
        params = list(module.parameters())
        grads = torch.autograd.grad(out.square().sum(), [q, k, v, *params])
        ref_grads = torch.autograd.grad(expected.square().sum(), [q, k, v, *ref.parameters()])
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
