"""Rotary position embeddings (RoPE, ``position: rope``): the formula, the relative-position
property, exact KV-cache decoding and streaming, every variant, the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from selection import first_of_each

import attn
from models import MultiHeadAttention, RotaryEmbedding, create_model


def causal_cases() -> list:
    """Every example parameter set of every attention with a causal form that RoPE composes
    with (a relative position bias is refused with RoPE); the first of each variant in the
    default run, the others ``slow``."""
    return first_of_each(
        (name, dict(params))
        for name in attn.list_attention()
        if attn.attention_info(name).supports_causal
        for params in attn.attention_info(name).example_params
        if not carries_bias(name, params)
    )


def every_case() -> list[tuple[str, dict]]:
    """The first example parameter set of every variant without a relative bias."""
    cases = []
    for name in attn.list_attention():
        params = [p for p in attn.attention_info(name).example_params if not carries_bias(name, p)]
        if params:
            cases.append((name, dict(params[0])))
    return cases


def carries_bias(name: str, params: dict) -> bool:
    return name == "relative" or bool(params.get("position_bias"))


def tiny(kind: str, name: str, params: dict, **overrides):
    torch.manual_seed(0)
    return create_model(kind, attention=name, attention_params=params, position="rope", **overrides).eval()


def direct_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The formula written out: pair i = (channel i, channel i + D/2) turns by
    pos * base^(-2i/D), one pair and one token at a time; ``x (B, H, N, D)``, ``positions (B, N)``."""
    out = x.clone()
    batch, _, length, dim = x.shape
    for b in range(batch):
        for n in range(length):
            for i in range(dim // 2):
                theta = float(positions[b, n]) * base ** (-2 * i / dim)
                c, s = math.cos(theta), math.sin(theta)
                a, bb = x[b, :, n, i], x[b, :, n, i + dim // 2]
                out[b, :, n, i] = a * c - bb * s
                out[b, :, n, i + dim // 2] = a * s + bb * c
    return out


def test_rope_matches_the_direct_formula():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 7, 1000], [3, 3, 4, 50, 123456]])
    got = RotaryEmbedding(8)(x, positions)
    torch.testing.assert_close(got, direct_rope(x, positions), atol=1e-10, rtol=1e-10)
    # position 0 is the identity; the norm of every pair is kept
    torch.testing.assert_close(RotaryEmbedding(8)(x, torch.zeros(1, 5, dtype=torch.long)), x)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))
    # one row of positions broadcasts over the batch
    shared = torch.tensor([[4, 5, 6, 7, 8]])
    torch.testing.assert_close(RotaryEmbedding(8)(x, shared), direct_rope(x, shared.expand(2, -1)))


def test_rope_score_depends_only_on_the_offset():
    """q_m . k_n is a function of m - n: the same pair of vectors at (m, n) and (m + s, n + s)
    scores the same, at small and very large s; different offsets score differently."""
    torch.manual_seed(1)
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        qm = rope(q, torch.tensor([[m]]))
        kn = rope(k, torch.tensor([[n]]))
        return float((qm * kn).sum())

    for m, n in [(5, 2), (0, 3), (9, 9)]:
        for shift in (1, 17, 1000, 10**6):
            assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-9, abs_tol=1e-9)
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-6)
    # float32 inputs far along (a long stream): still relative to 1e-5
    q32, k32 = q.float(), k.float()
    near = float((rope(q32, torch.tensor([[7]])) * rope(k32, torch.tensor([[3]]))).sum())
    far = float((rope(q32, torch.tensor([[10**6 + 7]])) * rope(k32, torch.tensor([[10**6 + 3]]))).sum())
    assert math.isclose(near, far, rel_tol=1e-5, abs_tol=1e-5)


@pytest.mark.parametrize(("name", "params"), causal_cases(), ids=lambda v: str(v))
def test_decoder_cached_steps_equal_the_batch_forward(name, params):
    model = tiny("decoder_lm", name, params, norm="pre")
    ids = torch.randint(0, 32, (2, 19), generator=torch.Generator().manual_seed(1))  # trims banded caches
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(ids[:, :5], cache=cache)]
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(5, ids.shape[1])]
        full = model(ids)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert torch.equal(model.generate(ids[:, :4], 8), model.generate(ids[:, :4], 8, use_cache=False))


@pytest.mark.parametrize(("name", "params"), causal_cases(), ids=lambda v: str(v))
def test_encoder_decoder_cached_steps_equal_the_batch_forward(name, params):
    model = tiny("encoder_decoder", name, params)
    src = torch.randint(2, 32, (2, 9), generator=torch.Generator().manual_seed(2))
    src_mask = torch.ones(2, 9, dtype=torch.bool)
    src_mask[1, 6:] = False
    tgt = torch.randint(2, 32, (2, 14), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(tgt.shape[1])]
        full = model(src, tgt, src_key_mask=src_mask)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    cached = model.generate(src, 8, src_key_mask=src_mask)
    assert torch.equal(cached, model.generate(src, 8, src_key_mask=src_mask, use_cache=False))


@pytest.mark.parametrize(("name", "params"), every_case(), ids=lambda v: str(v))
def test_encoder_with_rope_runs_every_variant(name, params):
    model = tiny("encoder_classifier", name, params, pooling="mean")
    ids = torch.randint(0, 32, (2, 13), generator=torch.Generator().manual_seed(4))
    key_mask = torch.ones(2, 13, dtype=torch.bool)
    key_mask[0, 10:] = False
    with torch.no_grad():
        out = model(ids, key_mask)
        # the rotation is applied: the same weights without it give another output
        plain = create_model("encoder_classifier", attention=name, attention_params=params,
                             position="none", pooling="mean")
        plain.load_state_dict(model.state_dict())
        other = plain.eval()(ids, key_mask)
    assert out.shape == (2, 2) and torch.isfinite(out).all()
    if params.get("window", 1) > 0 or params.get("num_global", 0) > 0:  # window 0: each token sees itself
        assert not torch.allclose(out, other)
    assert model.encoder.blocks[0].self_attn.rope is not None


def test_the_rotation_is_on_queries_and_keys_before_the_variant():
    """A self-attention with RoPE equals the variant called on rotated q and k by hand."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, "sliding_window", {"window": 2}, rope=True)
    x = torch.randn(2, 9, 16)
    q, k, v = (t.view(2, 9, 2, 8).transpose(1, 2) for t in (mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)))
    positions = torch.arange(9)[None].expand(2, -1)
    q_rot, k_rot = (direct_rope(t.double(), positions).float() for t in (q, k))  # (B, H, N, D)
    expected = mha.attend(q_rot, k_rot, v, causal=True)
    torch.testing.assert_close(mha(x, causal=True), expected, atol=1e-6, rtol=1e-6)
    assert MultiHeadAttention(16, 2, "full", {}, rope=False).rope is None


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize(("name", "params"),
                         [c for c in every_case() if attn.attention_info(c[0]).exact], ids=lambda v: str(v))
def test_stream_with_rope_equals_the_batch_forward_on_the_window(name, params, num_layers):
    """Streaming rotates each token once, by its place in the stream (not in the window):
    every step still equals the batch forward on the window (oldest token at 0)."""
    model = tiny("encoder_classifier", name, params, num_layers=num_layers)
    stream = model.stream(6)
    ids = torch.randint(0, 32, (2, 15), generator=torch.Generator().manual_seed(3))
    for t in range(ids.shape[1]):
        y = stream.step(ids[:, t])
        expected = stream.batch_forward(ids[:, max(0, t - 5) : t + 1])
        torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    stream.prefill(ids[:, :10])
    torch.testing.assert_close(stream.step(ids[:, 10]), stream.batch_forward(ids[:, 5:11]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"d_model": 30, "num_heads": 2}, "d_model", "even head dim"),
        ({"attention": "relative"}, "position", "one position scheme"),
        ({"attention": "sliding_window", "attention_params": {"window": 2, "position_bias": "alibi"}},
         "position", "relative position bias"),
        ({"mixer": "lstm"}, "position", "no self-attention"),
    ],
    ids=["odd-head-dim", "relative", "position_bias", "recurrent"],
)
def test_rope_refusals_name_the_field(overrides, field, words):
    with pytest.raises(ValueError, match=f"^{field}:.*{words}") as err:
        create_model("decoder_lm", position="rope", **overrides)
    assert "\n" not in str(err.value)


def test_rotary_module_refusals():
    with pytest.raises(ValueError, match="^head_dim: must be an even integer"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="^base: must be a finite number > 1"):
        RotaryEmbedding(8, base=1.0)
    with pytest.raises(ValueError, match="^head_dim: must be even for rotary positions"):
        MultiHeadAttention(30, 2, rope=True)
    with pytest.raises(ValueError, match=r"^positions: must have shape \(B, 5\)"):
        RotaryEmbedding(8)(torch.randn(1, 1, 5, 8), torch.arange(4)[None])
