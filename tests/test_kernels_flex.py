"""The ``flex`` kernel: declared limits, exactness, compile time reported apart, no recompile-limit
fallback over a sweep of shapes. CPU compiles take seconds, so the cases are few and small."""

from __future__ import annotations

import pytest
import torch

from attn import create_attention


def test_declared_limits_on_cpu() -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    reasons = module.supports("cpu", torch.float32, False, True)
    assert any("backward" in r for r in reasons)
    assert any("float64" in r for r in module.supports("cpu", torch.float64, False, False))
    assert module.supports("cpu", torch.float32, True, False) == []
    with pytest.raises(NotImplementedError, match="backward"):
        q = torch.randn(1, 1, 8, 8, requires_grad=True)
        module(q, q, q)


def test_matches_reference_with_key_mask_and_decoding_shape() -> None:
    module = create_attention("dilated", window=2, dilation=3, kernel="flex")
    ref = create_attention("dilated", window=2, dilation=3, kernel="reference")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 33, 16, generator=gen)
    k, v = torch.randn(2, 2, 70, 16, generator=gen), torch.randn(2, 2, 70, 16, generator=gen)
    key_mask = torch.rand(2, 70, generator=gen) > 0.3
    key_mask[1] = False  # rows with no key: zeros
    with torch.no_grad():
        out = module(q, k, v, causal=True, key_mask=key_mask)
        first = module.last_path
        torch.testing.assert_close(out, ref(q, k, v, causal=True, key_mask=key_mask),
                                   atol=1e-5, rtol=0)
        key_mask2 = torch.rand(2, 70, generator=gen) > 0.5  # new data, same shape: no recompile
        out = module(q, k, v, causal=True, key_mask=key_mask2)
        torch.testing.assert_close(out, ref(q, k, v, causal=True, key_mask=key_mask2),
                                   atol=1e-5, rtol=0)
    assert first.compile_s is not None and first.compile_s > 0 and first.fallback is None
    assert module.last_path.compile_s is None and module.last_path.fallback is None


@pytest.mark.slow
def test_sweep_of_shapes_never_falls_back_to_eager() -> None:
    """More shapes than dynamo's recompile limit (8) on one module: each compiles once."""
    module = create_attention("relative", bias="alibi", num_heads=1, kernel="flex")
    ref = create_attention("relative", bias="alibi", num_heads=1, kernel="reference")
    limit = getattr(torch._dynamo.config, "recompile_limit", 8)
    with torch.no_grad():
        for n in range(16, 16 + limit + 2):
            q = torch.randn(1, 1, n, 16)
            out = module(q, q, q)
            assert module.last_path.fallback is None, module.last_path.fallback
            assert module.last_path.compile_s is not None
            torch.testing.assert_close(out, ref(q, q, q), atol=1e-5, rtol=0)
