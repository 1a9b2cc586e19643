"""Bad input gets a ValueError / NotImplementedError naming the argument and what is allowed."""

from __future__ import annotations

import pytest
import torch

from attn import AttentionCall, check_attention_params, create_attention


def qkv(b=1, h=2, nq=5, nk=5, d=4, dtype=torch.float32):
    q = torch.randn(b, h, nq, d, dtype=dtype)
    return q, torch.randn(b, h, nk, d, dtype=dtype), torch.randn(b, h, nk, d, dtype=dtype)


@pytest.fixture
def att():
    return create_attention("sliding_window", window=2)


def test_wrong_rank(att) -> None:
    q, k, v = qkv()
    pattern = r"sliding_window: argument 'q' must be 4-D \(B, H, N, D\); got shape \(2, 5, 4\)"
    with pytest.raises(ValueError, match=pattern):
        att(q[0], k, v)


def test_not_a_tensor(att) -> None:
    q, _k, v = qkv()
    with pytest.raises(ValueError, match="argument 'k' must be a torch.Tensor; got list"):
        att(q, [1], v)


def test_integer_dtype(att) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"argument 'v' has dtype torch.int64; allowed dtypes are .*torch.float32"):
        att(q, k, v.long())


def test_mixed_dtypes(att) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="must share one dtype"):
        att(q, k.double(), v)


def test_mixed_devices(att) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="must be on one device"):
        att(q, k.to("meta"), v)


def test_mismatched_shapes(att) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"'k' and 'v' must share batch and key heads \(B, H_kv\)"):
        att(q, k, v[:, :1])
    with pytest.raises(ValueError, match=r"'q' and 'k' must share head_dim D; got 4 and 3"):
        att(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"'k' and 'v' must share the key length Nk; got 5 and 4"):
        att(q, k, v[:, :, :4])


def test_bad_key_mask(att) -> None:
    q, k, v = qkv(b=2)
    with pytest.raises(ValueError, match=r"'key_mask' must have dtype torch.bool"):
        att(q, k, v, key_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"'key_mask' must have shape \(B, Nk\) = \(2, 5\); got \(2, 4\)"):
        att(q, k, v, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"'key_mask' is on meta"):
        att(q, k, v, key_mask=torch.ones(2, 5, dtype=torch.bool, device="meta"))


def test_heads_disagree_with_module() -> None:
    att = create_attention("relative", bias="alibi", num_heads=4)
    q, k, v = qkv(h=2)
    with pytest.raises(ValueError, match="has 2 heads but the module was built with num_heads=4"):
        att(q, k, v)


@pytest.mark.parametrize(
    ("name", "params", "pattern"),
    [
        ("sliding_window", {"window": -1}, r"sliding_window: parameter 'window': must be an integer >= 0; got -1"),
        ("sliding_window", {"window": 2.5}, r"parameter 'window': must be an integer >= 0; got 2.5"),
        ("dilated", {"dilation": 0}, r"dilated: parameter 'dilation': must be an integer >= 1; got 0"),
        ("global_tokens", {"num_global": -2}, r"parameter 'num_global': must be an integer >= 0"),
        ("nystrom", {"num_landmarks": 0}, r"nystrom: parameter 'num_landmarks': must be an integer >= 1"),
        ("nystrom", {"conv_kernel": 4, "num_heads": 2}, r"'conv_kernel': must be odd; got 4"),
        ("relative", {"bias": "rope"}, r"relative: parameter 'bias': unknown value 'rope'"
            r"; allowed values are \['learned', 'alibi'\]"),
        ("relative", {"bias": "learned"}, r"parameter 'num_heads' is required"),
        ("full", {"position_bias": "t5"}, r"parameter 'position_bias': unknown value 't5'"
            r"; allowed values are \[None, 'learned', 'alibi'\]"),
        ("full", {"kernel": "flash9"}, r"full: parameter 'kernel': unknown value 'flash9'"
            r"; allowed values are \['auto', 'reference', 'sdpa'"),
        ("full", {"window": 3}, r"full: unknown parameter\(s\) 'window'; allowed parameters are"),
        ("no_such_attention", {}, r"unknown name 'no_such_attention'; registered attentions are .*sliding_window"),
    ],
)
def test_bad_parameters(name, params, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        create_attention(name, **params)
    with pytest.raises(ValueError, match=pattern):  # the same rule, found without building
        check_attention_params(name, **params)


def test_parameters_are_checked_without_building() -> None:
    """check_attention_params reads the class's rules: no constructor runs, good values pass."""
    from attn import register_attention
    from attn.registry import unregister_attention
    from attn.variants.sliding_window import SlidingWindowAttention

    class Unbuildable(SlidingWindowAttention):
        """The sliding window, but building one fails the test."""

        def __new__(cls, *args, **kwargs):
            raise AssertionError("check_attention_params built a module")

    register_attention("test_unbuildable_window", overwrite=True)(Unbuildable)
    try:
        with pytest.raises(AssertionError, match="built a module"):  # the class bites
            create_attention("test_unbuildable_window", window=3)
        check_attention_params("test_unbuildable_window", window=3, position_bias="alibi", num_heads=2,
                               head_dim=8)
        with pytest.raises(ValueError, match="parameter 'window': must be an integer >= 0; got -3"):
            check_attention_params("test_unbuildable_window", window=-3)
    finally:
        unregister_attention("test_unbuildable_window")


def test_causal_nystrom_is_not_implemented() -> None:
    att = create_attention("nystrom")
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="nystrom: argument 'causal' must be False"):
        att(q, k, v, causal=True)
    assert att.not_supported_reasons(AttentionCall("cpu", torch.float32, causal=True, requires_grad=False))
