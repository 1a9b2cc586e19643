"""The ``xformers`` kernel: honest reasons without CUDA/xformers; its mapping, via a stand-in module."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attn import AttentionCall, create_attention
from attn.kernels import get_kernel
from attn.kernels.xformers import attn_bias_for


def test_reasons_without_cuda() -> None:
    kernel = get_kernel("xformers")
    module = create_attention("sliding_window", window=4)
    cpu_call = AttentionCall(torch.device("cpu"), torch.float32, False, False)
    reasons = kernel.not_supported_reasons(module.pattern(), cpu_call)
    assert any("CUDA only" in r for r in reasons)
    reasons = kernel.not_supported_reasons(create_attention("dilated").pattern(),
                                           AttentionCall(torch.device("cuda"), torch.float64, False, False))
    assert any("float64" in r for r in reasons) and any("dilated" in r for r in reasons)
    assert module.not_supported_reasons(AttentionCall("cpu", torch.float32, False, False), kernel="xformers")


def test_reason_without_xformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA present (faked here) but xformers missing, the reason names the import."""
    monkeypatch.setitem(sys.modules, "xformers", None)  # import fails like a missing package
    monkeypatch.setitem(sys.modules, "xformers.ops", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kernel = get_kernel("xformers")
    reasons = kernel.not_supported_reasons(create_attention("full").pattern(),
                                           AttentionCall(torch.device("cuda"), torch.float16, False, False))
    assert len(reasons) == 1 and "xformers is not importable" in reasons[0]


class _Bias:
    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def _fake_ops(calls: list) -> types.SimpleNamespace:
    names = ["LowerTriangularFromBottomRightMask", "LocalAttentionFromBottomRightMask",
             "LowerTriangularFromBottomRightLocalAttentionMask"]
    bias_mod = types.SimpleNamespace(**{n: type(n, (_Bias,), {}) for n in names})

    def memory_efficient_attention(q, k, v, attn_bias=None):
        calls.append((q.shape, attn_bias))
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return types.SimpleNamespace(fmha=types.SimpleNamespace(attn_bias=bias_mod),
                                 memory_efficient_attention=memory_efficient_attention)


def test_bias_mapping_and_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    ops = _fake_ops(calls)
    bias, _ = attn_bias_for(ops, create_attention("full").pattern(), causal=False)
    assert bias is None
    bias, _ = attn_bias_for(ops, create_attention("causal").pattern(), causal=True)
    assert type(bias).__name__ == "LowerTriangularFromBottomRightMask"
    bias, _ = attn_bias_for(ops, create_attention("sliding_window", window=7).pattern(), causal=False)
    assert type(bias).__name__ == "LocalAttentionFromBottomRightMask"
    assert bias.kwargs == {"window_left": 7, "window_right": 7}
    bias, _ = attn_bias_for(ops, create_attention("sliding_window", window=7).pattern(), causal=True)
    assert bias.args == (8,)  # the diagonal plus w keys to the left
    # run(): (B, H, N, D) <-> (B, N, H, D) and the path, with the stand-in ops
    import attn.kernels.xformers as xmod

    monkeypatch.setattr(xmod, "load_xformers", lambda: (ops, None))
    q = torch.randn(2, 3, 10, 8)
    out, path = get_kernel("xformers").run(create_attention("full").pattern(), q, q, q, False, None)
    assert calls[-1][0] == (2, 10, 3, 8)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert path.kernel == "xformers"
    with pytest.raises(NotImplementedError, match="key_mask"):
        get_kernel("xformers").run(create_attention("full").pattern(), q, q, q, False,
                                   torch.ones(2, 10, dtype=torch.bool))


@pytest.mark.gpu
def test_matches_reference_on_cuda() -> None:  # pragma: no cover - needs a GPU and xformers
    pytest.importorskip("xformers")
    for name, params in [("full", {}), ("sliding_window", {"window": 16})]:
        module = create_attention(name, kernel="xformers", **params)
        ref = create_attention(name, kernel="reference", **params)
        q = torch.randn(1, 2, 100, 32, device="cuda", dtype=torch.float16)
        for causal in (False, True):
            torch.testing.assert_close(module(q, q, q, causal=causal),
                                       ref(q, q, q, causal=causal), atol=2e-3, rtol=0)


def test_key_mask_is_declared_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call with a key_mask is refused by not_supported_reasons (the signature sees it), so
    ``auto`` passes over xformers for it and a forward refuses it before running."""
    import attn.kernels.xformers as xmod
    from attn.kernels.auto import choose_kernel
    from attn.variants.full import FullAttention

    calls: list = []
    monkeypatch.setattr(xmod, "load_xformers", lambda: (_fake_ops(calls), None))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kernel, module = get_kernel("xformers"), create_attention("full").pattern()
    plain = AttentionCall("cuda", torch.float16, False, False, q_len=10, k_len=10, head_dim=8)
    padded = AttentionCall("cuda", torch.float16, False, False, q_len=10, k_len=10, head_dim=8,
                           has_key_mask=True)
    assert kernel.not_supported_reasons(module, plain) == []
    reasons = kernel.not_supported_reasons(module, padded)
    assert len(reasons) == 1 and "key_mask" in reasons[0]

    class XformersFirst(FullAttention):
        preferred_kernels = ("xformers", "reference")

    first = XformersFirst()
    assert choose_kernel(first.pattern(), plain, first.preferred_kernels) == "xformers"
    assert choose_kernel(first.pattern(), padded, first.preferred_kernels) == "reference"
    assert first.resolve_kernel(plain) == "xformers" and first.resolve_kernel(padded) == "reference"
    q = torch.randn(2, 3, 10, 8)
    with pytest.raises(NotImplementedError, match="kernel 'xformers' cannot run this call: .*key_mask"):
        create_attention("full", kernel="xformers")(q, q, q, key_mask=torch.ones(2, 10, dtype=torch.bool))
    assert not calls  # refused before running


# Kernels whose support depends on the dtype declare it from the call (xformers' cutlass-only
# float32 windows).
def test_xformers_declares_its_float32_windows_unsupported_from_the_call() -> None:
    pattern = create_attention("sliding_window", window=4).pattern()
    kernel = get_kernel("xformers")

    def reasons(dtype: torch.dtype, causal: bool, grad: bool) -> str:
        call = AttentionCall(torch.device("cuda"), dtype, causal, grad)
        return " | ".join(kernel.not_supported_reasons(pattern, call))

    assert "cutlass" in reasons(torch.float32, causal=False, grad=False)  # no bidirectional local
    assert "cutlass" in reasons(torch.float32, causal=True, grad=True)  # no causal local backward
    assert "cutlass" not in reasons(torch.float32, causal=True, grad=False)
    for dtype in (torch.bfloat16, torch.float16):  # flash runs both windows
        assert "cutlass" not in reasons(dtype, causal=False, grad=True)
    full = create_attention("full").pattern()  # no band: no dtype-dependent refusal
    assert "cutlass" not in " ".join(kernel.not_supported_reasons(
        full, AttentionCall(torch.device("cuda"), torch.float32, False, True)))
