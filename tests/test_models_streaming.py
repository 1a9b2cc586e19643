"""Streaming (continual) encoder: each step equals the batch forward's last position."""

from __future__ import annotations

import pytest
import torch

import attn
from models import TransformerBlock, create_model


def streaming_cases() -> list[tuple[str, dict]]:
    """Exact attentions (streaming must equal the batch forward), first example params."""
    return [
        (name, dict(attn.attention_info(name).example_params[0]))
        for name in attn.list_attention()
        if attn.attention_info(name).exact
    ]


def encoder(name: str, params: dict, **overrides):
    torch.manual_seed(0)
    return create_model(
        "encoder_classifier", attention=name, attention_params=params, position="none", **overrides
    ).eval()


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize(("name", "params"), streaming_cases(), ids=lambda v: str(v))
def test_stream_step_equals_batch_forward_on_the_window(name, params, num_layers):
    model = encoder(name, params, num_layers=num_layers)
    window = 6
    stream = model.stream(window)
    ids = torch.randint(0, 32, (2, 15), generator=torch.Generator().manual_seed(3))
    for t in range(ids.shape[1]):
        y = stream.step(ids[:, t])  # (B, D)
        start = max(0, t + 1 - window)
        expected = stream.batch_forward(ids[:, start : t + 1])
        torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    assert stream.length == window


@pytest.mark.parametrize("num_layers", [1, 2])
def test_prefill_equals_stepping(num_layers):
    model = encoder("sliding_window", {"window": 3}, num_layers=num_layers)
    ids = torch.randint(0, 32, (2, 12))
    stepped = model.stream(5)
    for t in range(10):
        stepped.step(ids[:, t])
    filled = model.stream(5)
    filled.prefill(ids[:, :10])
    assert filled.length == 5
    for t in (10, 11):
        torch.testing.assert_close(filled.step(ids[:, t]), stepped.step(ids[:, t]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_stream_with_relative_bias_and_pre_norm(norm):
    model = encoder("relative", {"bias": "alibi"}, num_layers=2, norm=norm)
    stream = model.stream(4)
    ids = torch.randint(0, 32, (1, 9))
    for t in range(9):
        y = stream.step(ids[:, t])
    torch.testing.assert_close(y, stream.batch_forward(ids[:, -4:]), atol=1e-5, rtol=1e-5)
    stream.reset()
    assert stream.length == 0


def test_stream_requires_position_free_encoder():
    model = create_model("encoder_classifier", position="sinusoidal")
    with pytest.raises(ValueError, match="^position:"):
        model.stream(8)
    with pytest.raises(ValueError, match="^window:"):
        encoder("full", {}).stream(0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_block_seams_compose_to_the_block(norm):
    """self_attention_inputs + finish (the seams streaming uses) equal the block's forward,
    causal or not; a block with cross-attention refuses finish (it would skip a sublayer)."""
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, 32, attention="sliding_window", attention_params={"window": 3}, norm=norm)
    x = torch.randn(2, 11, 16)
    for causal in (False, True):
        q, k, v = block.self_attention_inputs(x)
        assert q.shape == k.shape == v.shape == (2, 2, 11, 8)
        torch.testing.assert_close(block.finish(x, q, k, v, causal=causal), block(x, causal=causal))
    cross = TransformerBlock(16, 2, 32, cross_attention="full")
    with pytest.raises(ValueError, match="cross_attention"):
        cross.finish(x, q, k, v)


@pytest.mark.parametrize("position", ["none", "rope"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_retroactive_update_stays_exact_over_many_steps(num_layers, position):
    """Plain softmax attention takes the O(n d) update (2+ layers) and stays equal to the batch
    forward on the window through warm-up and 5 windows of tokens leaving."""
    torch.manual_seed(0)
    model = create_model("encoder_classifier", attention="full", num_layers=num_layers,
                         position=position, d_model=32, num_heads=4, d_ff=64).eval()
    window = 7
    stream = model.stream(window)
    ids = torch.randint(0, 32, (2, 6 * window), generator=torch.Generator().manual_seed(1))
    expected_path = "single-output" if num_layers == 1 else "retroactive-update"
    for t in range(ids.shape[1]):
        y = stream.step(ids[:, t])  # (B, D)
        assert stream.last_path.first_layer == expected_path
        assert stream.last_path.fallback is None
        start = max(0, t + 1 - window)
        torch.testing.assert_close(y, stream.batch_forward(ids[:, start : t + 1]), atol=1e-5, rtol=1e-5)


def test_retroactive_update_after_prefill_equals_batch_forward():
    torch.manual_seed(0)
    model = create_model("encoder_classifier", attention="full", num_layers=2, position="none",
                         d_model=32, num_heads=2, d_ff=64).eval()
    ids = torch.randint(0, 32, (1, 30))
    stream = model.stream(9)
    stream.prefill(ids[:, :12])
    for t in range(12, 30):
        y = stream.step(ids[:, t])
        torch.testing.assert_close(y, stream.batch_forward(ids[:, t - 8 : t + 1]), atol=1e-5, rtol=1e-5)
    assert stream.last_path.first_layer == "retroactive-update"


@pytest.mark.parametrize(("name", "params", "why"), [
    ("sliding_window", {"window": 2}, "has a mask_mod"),
    ("full", {"position_bias": "alibi"}, "has a score_mod"),
    ("causal", {}, "is causal"),
    ("nystrom", {"num_landmarks": 4}, "is an approximation"),
])
def test_other_attentions_take_the_recompute_path_and_say_why(name, params, why):
    model = encoder(name, params, num_layers=2)
    stream = model.stream(5)
    ids = torch.randint(0, 32, (2, 12))
    for t in range(ids.shape[1]):
        y = stream.step(ids[:, t])
    assert stream.last_path.first_layer == "retroactive-recompute"
    assert why in stream.last_path.fallback
    if attn.attention_info(name).exact:  # the fallback stays exact
        torch.testing.assert_close(y, stream.batch_forward(ids[:, -5:]), atol=1e-5, rtol=1e-5)


def test_retroactive_sums_survive_overflowing_scores_and_cancellation():
    """Scores of +-300 overflow unnormalised float32 sums; one key that dominates every row
    cancels the rows' sums when it leaves, and those rows are recomputed: every step's
    outputs equal softmax attention over the window in float64 to 1e-9."""
    from models.retroactive import RetroactiveSoftmax

    gen = torch.Generator().manual_seed(0)
    window, dim, steps = 6, 4, 30
    q = torch.randn(1, 2, steps, dim, generator=gen, dtype=torch.float64) * 3
    k = torch.randn(1, 2, steps, dim, generator=gen, dtype=torch.float64) * 3
    v = torch.randn(1, 2, steps, dim, generator=gen, dtype=torch.float64)
    k[:, :, 4] = q[:, :, :].mean(2) * 60  # token 4 dominates every row while in the window
    retro = RetroactiveSoftmax(window, dim)
    refreshed = []
    for t in range(steps):
        out = retro.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        refreshed.append(retro.refreshed)
        start = max(0, t + 1 - window)
        qw, kw, vw = (x[:, :, start : t + 1] for x in (q, k, v))
        expected = torch.softmax(qw @ kw.transpose(-2, -1) / dim**0.5, dim=-1) @ vw
        assert (qw @ kw.transpose(-2, -1) / dim**0.5).abs().max() < 1e4
        torch.testing.assert_close(out, expected, atol=1e-9, rtol=1e-9)
    assert refreshed[4 + window] > 0  # when token 4 left, its rows were recomputed
    assert (q[:, :, 4:11] @ k[:, :, 4:5].transpose(-2, -1) / 2).max() > 88  # e^s overflows float32


def test_finish_heads_equals_finish():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, 32, attention="full")
    x = torch.randn(2, 5, 16)
    q, k, v = block.self_attention_inputs(x)
    heads = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v  # (B, H, N, Dh)
    torch.testing.assert_close(block.finish_heads(x, heads), block.finish(x, q, k, v))


def test_update_recompute_forces_the_baseline_and_bad_update_is_named():
    model = encoder("full", {}, num_layers=2)
    ids = torch.randint(0, 32, (1, 8))
    fast, slow = model.stream(4), model.stream(4, update="recompute")
    for t in range(8):
        torch.testing.assert_close(fast.step(ids[:, t]), slow.step(ids[:, t]), atol=1e-5, rtol=1e-5)
    assert fast.last_path.first_layer == "retroactive-update"
    assert slow.last_path.first_layer == "retroactive-recompute"
    assert "update='recompute'" in slow.last_path.fallback
    with pytest.raises(ValueError, match=r"^update: unknown value 'fast'; allowed values are \['auto', 'recompute'\]"):
        model.stream(4, update="fast")
