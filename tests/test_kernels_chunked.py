"""The ``chunked`` kernel: exact for any mask/score_mod, several chunks, gradients to bias tables."""

from __future__ import annotations

import pytest
import torch

from attn import create_attention
from attn.kernels.chunked import chunked_attention
from attn.kernels.reference import dense_attention
from attn.position_bias import RelativePositionBias
from attn.variants.dilated import dilated_mod


@pytest.mark.parametrize("kind", ["learned", "alibi"])
@pytest.mark.parametrize(("nq", "nk"), [(53, 53), (7, 53), (1, 30)])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_in_chunks(kind: str, nq: int, nk: int, causal: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    bias = RelativePositionBias(kind, 2, 5).double()
    q = torch.randn(2, 2, nq, 8, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(2, 2, nk, 8, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(2, 2, nk, 8, generator=gen, dtype=torch.float64).requires_grad_()
    key_mask = torch.rand(2, nk, generator=gen) > 0.3
    key_mask[1] = False
    params = list(bias.parameters())
    out = chunked_attention(q, k, v, score_mod=bias.score_mod(), score_params=tuple(params),
                            causal=causal, key_mask=key_mask, mask_mod=dilated_mod(3, 2), rows=4)
    ref = dense_attention(q, k, v, score_mod=bias.score_mod(), causal=causal, key_mask=key_mask,
                          mask_mod=dilated_mod(3, 2))
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *params])
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v, *params])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-9, rtol=0)


def test_relative_auto_on_cpu_uses_the_relative_kernel_for_long_calls() -> None:
    """Long relative calls on CPU run kernel ``relative`` (no N x N tensor); ``chunked`` is
    named, or the fallback for score terms that are not a declared relative bias."""
    module = create_attention("relative", bias="alibi", num_heads=2)
    q = torch.randn(1, 2, 1100, 8)
    module(q, q, q)
    assert module.last_path.kernel == "relative" and not module.last_path.mask_emulated
