"""Every kernel the committed results quote is right at the geometry they quote.

The conformance kit proves kernels at short lengths; the benchmarks run them at N >= 4096
with a 128 window and 64-row blocks, where chunking, stream edges and cached masks take
paths short lengths never reach. Forward and backward are compared with the dense
reference in float64 (flex: forward only, float32, as on CPU).
"""

from __future__ import annotations

import pytest
import torch

from attn import create_attention
from attn.kernels.blocked import block_size
from attn.kernels.reference import dense_attention

N, HEADS, DIM = 4096, 2, 32

#: (variant, params, kernel) as in the committed linear-cpu / scaling-cpu runs
CASES = [
    ("sliding_window", {"window": 128}, "blocked"),
    ("dilated", {"window": 128, "dilation": 2}, "blocked"),
    ("dilated", {"window": 64, "dilation": 2}, "blocked"),
    ("global_tokens", {"num_global": 16, "window": 128}, "blocked"),
    ("sliding_window", {"window": 128}, "sdpa"),
    ("global_tokens", {"num_global": 16, "window": 128}, "sdpa"),
    ("full", {}, "sdpa"),
    ("causal", {}, "sdpa"),
    ("relative", {"bias": "alibi"}, "chunked"),
]


def _inputs(dtype: torch.dtype, grad: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, HEADS, N, DIM, generator=gen, dtype=dtype).requires_grad_(grad)
                 for _ in range(3))


def test_the_blocked_kernel_runs_its_benchmarked_block_size():
    assert block_size(128) == 64


@pytest.mark.slow
@pytest.mark.parametrize(("name", "params", "kernel"), CASES)
def test_forward_and_backward_match_the_reference(name, params, kernel):
    module = create_attention(name, num_heads=HEADS, head_dim=DIM, kernel=kernel, **params)
    module = module.to(torch.float64)
    q, k, v = _inputs(torch.float64, grad=True)
    weight = torch.randn(1, HEADS, N, DIM, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    out = module(q, k, v)
    assert module.last_path.kernel == kernel
    (out * weight).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = dense_attention(q2, k2, v2, mask_mod=module.mask_mod(), score_mod=module.score_mod(),
                          causal=module.forces_causal)
    (ref * weight).sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    for got, expected in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.parametrize(("name", "params"), [
    ("sliding_window", {"window": 128}), ("dilated", {"window": 128, "dilation": 2}),
    ("global_tokens", {"num_global": 16, "window": 128}),
])
def test_flex_forward_matches_the_reference(name, params):
    module = create_attention(name, num_heads=HEADS, head_dim=DIM, kernel="flex", **params)
    q, k, v = _inputs(torch.float32, grad=False)
    with torch.no_grad():
        out = module(q, k, v)
    assert module.last_path.fallback is None, module.last_path.fallback
    ref = dense_attention(q.double(), k.double(), v.double(), mask_mod=module.mask_mod())
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)


@pytest.mark.slow
def test_nystrom_matches_its_written_out_formula_at_the_benchmarked_size():
    """The landmark path (softmax products through SDPA) at N=4096, m=64 equals the textbook
    matrices product."""
    from attn.mods import masked_softmax
    from attn.variants.nystrom import iterative_pinv

    m = 64
    module = create_attention("nystrom", num_landmarks=m).to(torch.float64)
    q, k, v = _inputs(torch.float64, grad=True)
    out = module(q, k, v)
    assert "SDPA" in module.last_path.path
    scale = DIM ** -0.25
    qs, ks = q.detach() * scale, k.detach() * scale
    q_land = qs.unflatten(2, (m, N // m)).mean(3)  # (1, H, m, D)
    k_land = ks.unflatten(2, (m, N // m)).mean(3)
    kernel_1 = masked_softmax(qs @ k_land.transpose(-1, -2), None)  # (1, H, N, m)
    kernel_2 = masked_softmax(q_land @ k_land.transpose(-1, -2), None)  # (1, H, m, m)
    kernel_3 = masked_softmax(q_land @ ks.transpose(-1, -2), None)  # (1, H, m, N)
    expected = kernel_1 @ iterative_pinv(kernel_2, 6) @ (kernel_3 @ v.detach())
    torch.testing.assert_close(out.detach(), expected, atol=1e-10, rtol=1e-8)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
