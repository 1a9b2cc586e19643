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
