"""Under bf16 autocast (what mixed-precision training turns on), every built-in variant runs
forward and backward on every kernel that accepts the call: finite output and gradients, and
kernels that compute in float32 still do (autocast would otherwise recast their float32
matmuls to bf16 and mix dtypes) and return the caller's dtype. See docs/gpu.md.

Kernels that compile per call shape (``flex``) are left out: compiling on the CPU takes
minutes here; they are exercised under autocast only by a GPU run.
"""

from __future__ import annotations

import pytest
import torch
from selection import first_of_each

from attn import attention_info, create_attention, get_kernel, list_attention
from attn.call import AttentionCall

#: kernels that compute in float32 whatever the input (and Nystrom's own landmark path)
FLOAT32_KERNELS = ("reference", "chunked", "blocked", "native")
BUILTIN = ("full", "causal", "sliding_window", "dilated", "global_tokens", "nystrom", "relative")

CASES = [
    (name, kernel, i)
    for name in list_attention() if name in BUILTIN
    for kernel in attention_info(name).kernels
    if not get_kernel(kernel).compiles_per_shape
    for i in range(len(attention_info(name).example_params))
]


#: each (variant, kernel) with its first parameter set in the default run, the others slow
@pytest.mark.parametrize(("name", "kernel", "i"), first_of_each(CASES, key=lambda case: case[:2]),
                         ids=[f"{n}-{k}-{i}" for n, k, i in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backward_inside", [False, True], ids=["bwd_after", "bwd_inside"])
def test_forward_and_backward_under_bf16_autocast(name, kernel, i, dtype, causal, backward_inside):
    info = attention_info(name)
    if causal and not info.supports_causal:
        pytest.skip(f"{name} has no causal form")
    params = dict(info.example_params[i])
    module = create_attention(name, num_heads=2, head_dim=16, kernel=kernel, **params)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    key_mask = torch.ones(2, 40, dtype=torch.bool)
    key_mask[1, 33:] = False
    call = AttentionCall.from_tensors(q, k, v, causal, key_mask, True)
    reasons = module.not_supported_reasons(call)
    if reasons:
        pytest.skip("; ".join(reasons))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(q, k, v, causal=causal, key_mask=key_mask)  # (B, H, N, Dv)
        # fp32-computing kernels return the caller's dtype; fused ones run in autocast's
        assert out.dtype in (dtype, torch.bfloat16), out.dtype
        loss = out.float().square().mean()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    if kernel in FLOAT32_KERNELS and "conv_kernel" not in params:  # (a conv layer may run in bf16)
        assert out.dtype == dtype
        with torch.no_grad():
            plain = module(q, k, v, causal=causal, key_mask=key_mask)  # (B, H, N, Dv), no autocast
        # the same float32 computation as without autocast, not a bf16 one (errors ~1e-2)
        torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out.float()).all()
    for t in (q, k, v, *module.parameters()):
        if t.grad is not None:
            assert torch.isfinite(t.grad.float()).all()
    assert q.grad is not None and q.grad.dtype == dtype
