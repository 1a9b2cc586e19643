"""``kernel="auto"``: the documented choice per device and pass, recorded on the path."""

from __future__ import annotations

import pytest
import torch

from attn import AttentionCall, attention_info, create_attention, get_kernel, list_attention
from attn.kernels import auto, kernels_for
from attn.kernels.auto import choose_kernel

CASES = [  # (variant, params, device, requires_grad, expected)
    ("sliding_window", {"window": 8}, "cpu", False, "blocked"),
    ("sliding_window", {"window": 8}, "cpu", True, "blocked"),
    ("dilated", {}, "cpu", True, "blocked"),
    ("global_tokens", {}, "cpu", False, "blocked"),
    ("full", {}, "cpu", True, "sdpa"),
    ("causal", {}, "cpu", False, "sdpa"),
    ("relative", {"bias": "alibi", "num_heads": 2}, "cpu", True, "relative"),
    ("nystrom", {}, "cpu", True, "native"),
    ("sliding_window", {"window": 8}, "cuda", True, "flex"),
    ("full", {}, "cuda", True, "sdpa"),
    ("relative", {"bias": "alibi", "num_heads": 2}, "cuda", True, "flex"),
]


@pytest.mark.parametrize(("name", "params", "device", "grad", "expected"), CASES)
def test_auto_choice(name: str, params: dict, device: str, grad: bool, expected: str) -> None:
    module = create_attention(name, **params)
    assert choose_kernel(module.pattern(), AttentionCall(torch.device(device), torch.float32, False, grad)) == expected


def test_flex_never_chosen_for_cpu_backward_or_float64() -> None:
    module = create_attention("sliding_window", window=8, kernel="flex")
    assert module.not_supported_reasons(AttentionCall("cpu", torch.float32, False, True))
    assert module.not_supported_reasons(AttentionCall("cpu", torch.float64, False, False))


def test_chosen_kernel_recorded() -> None:
    module = create_attention("sliding_window", window=4)
    q = torch.randn(1, 2, 800, 8, requires_grad=True)
    module(q, q, q).sum().backward()
    assert module.last_path.kernel == "blocked"


@pytest.mark.parametrize(("name", "params", "k_len", "expected"), [
    ("sliding_window", {"window": 16}, 767, "sdpa"),  # short: one dense call over a cached mask
    ("sliding_window", {"window": 16}, 768, "blocked"),
    ("dilated", {"window": 8, "dilation": 2}, 512, "sdpa"),
    ("global_tokens", {"num_global": 2, "window": 8}, 4096, "blocked"),
    ("relative", {"bias": "alibi", "num_heads": 2}, 1023, "sdpa"),
    ("relative", {"bias": "alibi", "num_heads": 2}, 1024, "relative"),
    ("full", {}, 64, "sdpa"),
    ("nystrom", {}, 64, "native"),
])
def test_short_calls_on_cpu_take_the_dense_kernel(name, params, k_len, expected) -> None:
    module = create_attention(name, **params)
    call = AttentionCall(torch.device("cpu"), torch.float32, False, True, q_len=k_len, k_len=k_len)
    assert choose_kernel(module.pattern(), call) == expected


def test_the_choice_follows_the_call_and_is_made_once_per_call_description(monkeypatch) -> None:
    import attn.kernels.auto as auto

    calls = []
    real = auto.choose_kernel
    monkeypatch.setattr(auto, "choose_kernel", lambda *a: calls.append(a) or real(*a))
    module = create_attention("sliding_window", window=4)
    for n in (40, 40, 41, 900, 901):
        q = torch.randn(1, 2, n, 8)
        module(q, q, q)
        assert module.last_path.kernel == ("sdpa" if n < 768 else "blocked")
    assert len(calls) == 2  # one short call description, one long


def test_a_call_from_tensors_and_without_them() -> None:
    q = torch.randn(2, 3, 5, 8, requires_grad=True)
    k = torch.randn(2, 3, 9, 8)
    call = AttentionCall.from_tensors(q, k, k, causal=True, key_mask=torch.ones(2, 9, dtype=torch.bool))
    assert call == AttentionCall(torch.device("cpu"), torch.float32, True, True, 5, 9, 8, True)
    assert call.self_attention is False
    with torch.no_grad():
        assert not AttentionCall.from_tensors(q, k, k).requires_grad
    bare = AttentionCall("cpu", torch.float64)  # any lengths, no key_mask
    assert bare.device == torch.device("cpu") and bare.q_len is None and bare.self_attention is None
    assert bare.describe() == "device=cpu, dtype=torch.float64, causal=False, requires_grad=False"
    assert call.describe().endswith("Nq=5, Nk=9, key_mask given")


# On CUDA `auto` never picks a CPU-tuned kernel where flex or SDPA serve.
def test_auto_on_cuda_never_picks_a_cpu_tuned_kernel_where_flex_or_sdpa_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list_attention():  # head_dim: a plug-in with learned per-head maps needs it
        pattern = create_attention(name, num_heads=4, head_dim=64,
                                   **attention_info(name).example_params[0]).pattern()
        order = auto.auto_order(pattern, torch.device("cuda"), k_len=1 << 19)
        gpu = [i for i, kernel in enumerate(order) if kernel in ("flex", "sdpa")]
        cpu_tuned = [i for i, kernel in enumerate(order) if kernel in auto.CPU_TUNED_KERNELS]
        if gpu and cpu_tuned:
            assert max(gpu) < min(cpu_tuned), (name, order)
    # flex refusing a call (as it might for a reason of its own): sdpa, not blocked, serves
    flex = get_kernel("flex")
    monkeypatch.setattr(type(flex), "not_supported_reasons", lambda self, pattern, call=None: ["no"])
    for name in ("sliding_window", "dilated", "global_tokens", "relative"):
        pattern = create_attention(name, num_heads=4, **attention_info(name).example_params[0]).pattern()
        call = AttentionCall(torch.device("cuda"), torch.bfloat16, True, True, 1 << 16, 1 << 16, 64)
        chosen = auto.choose_kernel(pattern, call)
        assert chosen not in auto.CPU_TUNED_KERNELS, (name, chosen)
        assert "sdpa" in kernels_for(pattern) and chosen in ("sdpa", "xformers"), (name, chosen)
