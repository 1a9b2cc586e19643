"""Model configs, model sizes and the model registry."""

from __future__ import annotations

import dataclasses

import pytest

import models
from models import create_model, list_models, model_config


def test_registry_lists_the_built_in_kinds():
    assert list_models() == ["decoder_lm", "encoder_classifier", "encoder_decoder", "vit", "vivit"]
    assert list_models("enc*") == ["encoder_classifier", "encoder_decoder"]


@pytest.mark.parametrize("size", ["mini", "medium", "lra_base"])
@pytest.mark.parametrize("kind", list_models())
def test_sizes_build_valid_configs(kind, size):
    config = model_config(kind, size)
    assert config.d_model % config.num_heads == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 8  # type: ignore[misc]


def test_overrides_reach_the_model():
    model = create_model("encoder_classifier", vocab_size=50, num_classes=5, d_model=48, num_heads=3)
    assert model.config.vocab_size == 50 and model.config.num_classes == 5
    assert model.head.out_features == 5 and model.token_emb.weight.shape == (50, 48)


@pytest.mark.parametrize(
    ("kind", "overrides", "field"),
    [
        ("encoder_classifier", {"d_model": 30, "num_heads": 4}, "d_model"),
        ("decoder_lm", {"attention": "nystrom"}, "attention"),
        ("encoder_decoder", {"attention": "nystrom"}, "attention"),
        ("vit", {"image_size": 16, "patch_size": 5}, "patch_size"),
        ("encoder_classifier", {"pooling": "max"}, "pooling"),
        ("decoder_lm", {"norm": "sandwich"}, "norm"),
        ("decoder_lm", {"activation": "tanh"}, "activation"),
        ("decoder_lm", {"attention": "relative", "position": "learned"}, "position"),
        ("decoder_lm", {"attention": "no_such_attention"}, "attention"),
        ("decoder_lm", {"attention": "sliding_window", "attention_params": {"w": 3}}, "attention"),
        ("decoder_lm", {"colour": "red"}, "colour"),
        ("decoder_lm", {"num_layers": 0}, "num_layers"),
        ("vit", {"patch_size": 1, "max_len": 16}, "max_len"),
        ("encoder_decoder", {"decoder_attention_params": {"window": 2}}, "decoder_attention_params"),
        ("encoder_decoder", {"decoder_attention": "nystrom"}, "decoder_attention"),
        ("encoder_decoder", {"bos_id": 99}, "bos_id"),
    ],
)
def test_invalid_configs_name_the_field(kind, overrides, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        create_model(kind, **overrides)


def test_unknown_kind_and_size():
    with pytest.raises(ValueError, match="^kind:"):
        create_model("rnn")
    with pytest.raises(ValueError, match="^size: unknown model size 'huge'; sizes are mini, medium"):
        create_model("vit", size="huge")


def test_position_resolves_from_attention():
    assert model_config("decoder_lm").position == "sinusoidal"
    assert model_config("vit").position == "learned"
    assert model_config("decoder_lm", attention="relative").position == "none"
    biased = model_config(
        "encoder_classifier", attention="sliding_window",
        attention_params={"window": 2, "position_bias": "alibi"},
    )
    assert biased.position == "none"


def test_encoder_decoder_can_use_a_causal_decoder_with_nystrom_encoder():
    model = create_model(
        "encoder_decoder", attention="nystrom", attention_params={"num_landmarks": 4},
        decoder_attention="full",
    )
    assert model.encoder.blocks[0].self_attn.attention.name == "nystrom"
    assert model.decoder_blocks[0].self_attn.attention.name == "full"


def test_public_names_exported():
    for name in models.__all__:
        assert hasattr(models, name)


@pytest.mark.parametrize("kind", list_models())
def test_tiny_preset_step_is_tiny(kind):
    """The tiny preset is for tests: one training step of batch 8 costs at most 1 GFLOP
    (counted, not timed, so a loaded machine cannot fail it; a 2-core CPU runs that in well
    under a second)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = create_model(kind)
    cfg = model.config
    if kind == "vit":
        inputs = (torch.randn(8, cfg.in_channels, cfg.image_size, cfg.image_size),)
    elif kind == "vivit":
        inputs = (torch.randn(8, cfg.frames, cfg.in_channels, cfg.image_size, cfg.image_size),)
    elif kind == "encoder_decoder":
        inputs = (torch.randint(0, cfg.vocab_size, (8, 128)), torch.randint(0, cfg.vocab_size, (8, 64)))
    else:
        inputs = (torch.randint(0, cfg.vocab_size, (8, 128)),)
    with FlopCounterMode(display=False) as counter:
        model(*inputs).float().mean().backward()
    assert 0 < counter.get_total_flops() <= 1e9
