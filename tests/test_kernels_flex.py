"""The ``flex`` kernel: declared limits, exactness, compile time reported apart, no recompile-limit
fallback and no wrong output over a sweep of shapes, no reads past the inputs, compiled code shared
only between equally configured modules. CPU compiles take seconds, so the cases are few and small,
and marked ``compile`` (the full run's, not the default run's)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from attn import AttentionCall, ExactAttention, MaskMod, create_attention, get_kernel, register_attention
from attn.kernels.reference import dense_attention
from attn.registry import unregister_attention
from attn.variants.sliding_window import sliding_window_mod


def test_declared_limits_on_cpu() -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    reasons = module.not_supported_reasons(AttentionCall("cpu", torch.float32, False, True))
    assert any("backward" in r for r in reasons)
    assert any("float64" in r for r in module.not_supported_reasons(AttentionCall("cpu", torch.float64, False, False)))
    assert module.not_supported_reasons(AttentionCall("cpu", torch.float32, True, False)) == []
    with pytest.raises(NotImplementedError, match="backward"):
        q = torch.randn(1, 1, 8, 8, requires_grad=True)
        module(q, q, q)


@pytest.mark.compile
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


def _in_nan_buffer(t: torch.Tensor, rows: int = 32) -> torch.Tensor:
    """``t (B, H, N, D)`` as a view into a buffer whose ``rows`` rows after N are NaN."""
    batch, heads, length, dim = t.shape
    buf = torch.full((batch, heads, length + rows, dim), float("nan"))
    buf[:, :, :length] = t
    return buf[:, :, :length]


@pytest.mark.slow
@pytest.mark.compile
def test_sweep_of_shapes_never_falls_back_to_eager() -> None:
    """More shapes than dynamo's recompile limit (8) on one module, inputs inside NaN-filled
    buffers: every output right (n = 24 is 8 past a multiple of 16), no eager fallback, compile
    time reported on every new shape, and lengths 17..25 share one compiled (padded) bucket."""
    module = create_attention("relative", bias="alibi", num_heads=1, kernel="flex")
    ref = create_attention("relative", bias="alibi", num_heads=1, kernel="reference")
    limit = getattr(torch._dynamo.config, "recompile_limit", 8)
    with torch.no_grad():
        for n in range(16, 16 + limit + 2):
            q = _in_nan_buffer(torch.randn(1, 1, n, 16))
            out = module(q, q, q)
            assert module.last_path.fallback is None, module.last_path.fallback
            assert module.last_path.compile_s is not None
            torch.testing.assert_close(out, ref(q, q, q), atol=1e-5, rtol=0)
    assert len(get_kernel("flex")._buckets_of(module.pattern())) == 2  # n = 16 as it is; 17..25 padded to 32


@pytest.mark.compile
def test_reads_nothing_past_the_keys_at_a_length_8_past_a_multiple_of_16() -> None:
    """Nk = 24, D = 16: torch's CPU template reads 8 keys past the end there unless padded."""
    module = create_attention("sliding_window", window=20, kernel="flex")
    ref = create_attention("sliding_window", window=20, kernel="reference")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (_in_nan_buffer(torch.randn(1, 2, 24, 16, generator=gen)) for _ in range(3))
    with torch.no_grad():
        out = module(q, k, v)
        torch.testing.assert_close(out, ref(q, k, v), atol=1e-5, rtol=0)
    assert module.last_path.fallback is None and out.shape == (1, 2, 24, 16)


class _Band(ExactAttention):
    """A plug-in-style band |i - j| <= width that keeps its width private and out of ``extra_repr``."""

    def __init__(self, width: int = 1, **common: Any) -> None:
        super().__init__(**common)
        self._width = width

    def mask_mod(self) -> MaskMod:
        width = self._width

        def band(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            return (i - j).abs() <= width

        return band

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"


@pytest.mark.compile
def test_plugin_instances_with_other_arguments_get_their_own_compiled_mask() -> None:
    register_attention("flex_test_band", overwrite=True)(_Band)
    try:
        narrow = create_attention("flex_test_band", width=1, kernel="flex")
        wide = create_attention("flex_test_band", width=6, kernel="flex")
        assert narrow.extra_repr() == wide.extra_repr()  # the repr cannot tell them apart
        same = create_attention("flex_test_band", width=1, kernel="flex")
        assert narrow.pattern().shared and narrow.pattern().key == same.pattern().key
        assert narrow.pattern().key != wide.pattern().key
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(3))
        with torch.no_grad():
            for module, width in ((narrow, 1), (wide, 6), (narrow, 1)):
                expected = dense_attention(q, k, v, mask_mod=sliding_window_mod(width))
                torch.testing.assert_close(module(q, k, v), expected, atol=1e-5, rtol=0)
                assert module.last_path.fallback is None
    finally:
        unregister_attention("flex_test_band")


def key(module: Any) -> Any:
    """The compile-cache key of ``module``'s pattern (None when it is kept per module)."""
    pattern = module.pattern()
    return pattern.key if pattern.shared else None


def test_cache_key_follows_arguments_and_attributes_not_copies() -> None:
    module = create_attention("sliding_window", window=4, kernel="flex")
    assert key(copy.deepcopy(module)) == key(module)  # copies share compiled code
    assert key(create_attention("sliding_window", window=5, kernel="flex")) != key(module)
    before = key(module)
    module.window = 5  # changed after construction: no longer the configuration compiled before
    assert key(module) != before
    biased = create_attention("relative", bias="alibi", num_heads=2, kernel="flex")
    assert key(biased) is None  # its mods close over its tensors: identified by the module itself
    assert biased.pattern().key == biased.pattern().key  # stable from call to call
    assert biased.pattern().owner is biased.pattern().owner
    assert copy.deepcopy(biased).pattern().key != biased.pattern().key  # a copy has its own tensors
