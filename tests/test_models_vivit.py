"""The ``vivit`` model kind (models/vivit.py): every structure builds and trains a step, the
token order is the grid the factorised pattern reads, and bad configs name their field."""

from __future__ import annotations

import pytest
import torch

from models.registry import create_model, list_models

STRUCTURES = [
    {},  # model 1: joint
    {"structure": "factorised_encoder"},  # model 2
    {"structure": "factorised_self_attention"},  # model 3
    {"attention": "factorised", "attention_params": {"axis": "split"}},  # model 4
    {"structure": "factorised_self_attention", "temporal_attention": "sliding_window",
     "temporal_attention_params": {"window": 1}},
]


@pytest.mark.parametrize("settings", STRUCTURES, ids=lambda s: s.get("structure", s.get("attention", "joint")))
def test_every_structure_classifies_and_learns_a_step(settings: dict) -> None:
    torch.manual_seed(0)
    model = create_model("vivit", "mini", num_classes=3, **settings)
    videos = torch.rand(2, 4, 1, 16, 16)  # (B, T, C, H, W)
    logits = model(videos)
    assert logits.shape == (2, 3)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 2]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert "vivit" in list_models()


def _tokens(model, videos: torch.Tensor) -> torch.Tensor:
    """The joint encoder's output tokens (B, N, D), before pooling."""
    return model.encoder(model.pos_emb(model.embed(videos)))


def test_tubelet_tokens_are_frame_major_on_the_factorised_grid() -> None:
    # attention only within frames: changing frame 2 moves exactly the tokens of frame 2
    torch.manual_seed(0)
    model = create_model("vivit", "mini", attention="factorised", attention_params={"axis": "spatial"}).eval()
    videos = torch.rand(1, 4, 1, 16, 16)
    changed = videos.clone()
    changed[:, 2] = torch.rand(1, 1, 16, 16)
    moved = (_tokens(model, changed) - _tokens(model, videos)).abs().amax(-1)[0]  # (N,)
    s = model.config.positions  # 16 tokens a frame
    assert moved[2 * s:3 * s].min() > 0 and moved[:2 * s].max() == 0 and moved[3 * s:].max() == 0


def test_temporal_axis_keeps_positions_apart() -> None:
    # attention only across frames: changing one patch moves that position in every frame only
    torch.manual_seed(0)
    model = create_model("vivit", "mini", attention="factorised", attention_params={"axis": "temporal"}).eval()
    videos = torch.rand(1, 4, 1, 16, 16)
    changed = videos.clone()
    changed[:, 1, :, 4:8, 8:12] += 1.0  # frame 1, patch row 1, column 2: position 1 * 4 + 2 = 6
    moved = (_tokens(model, changed) - _tokens(model, videos)).abs().amax(-1)[0].view(4, 16)  # (T, S)
    assert (moved[:, 6] > 0).all() and moved[:, [p for p in range(16) if p != 6]].max() == 0


def test_tubelet_frames_shorten_the_grid() -> None:
    model = create_model("vivit", "mini", frames=4, tubelet_frames=2, attention="factorised",
                         attention_params={"axis": "split"})
    assert model.config.token_frames == 2 and model.config.num_tokens == 32
    assert model(torch.rand(1, 4, 1, 16, 16)).shape == (1, 2)


@pytest.mark.parametrize(("settings", "message"), [
    ({"structure": "divided"}, "structure: unknown value 'divided'"),
    ({"tubelet_frames": 3}, "tubelet_frames: must divide frames=4; got 3"),
    ({"patch_size": 5}, "patch_size: must divide image_size=16; got 5"),
    ({"attention": "factorised", "attention_params": {"positions_per_frame": 8}},
     r"attention_params: positions_per_frame must be the 16 tokens of a frame"),
    ({"attention": "factorised", "attention_params": {"frames": 3}},
     "attention_params: frames must be the 4 token frames"),
    ({"attention": "factorised", "structure": "factorised_encoder"}, "needs structure 'joint'"),
    ({"temporal_attention": "factorised"}, "temporal_attention: 'factorised' attends on the grid"),
    ({"temporal_attention_params": {"window": 2}}, "temporal_attention_params: given without"),
    ({"position": "rope"}, "position: must be 'learned', 'sinusoidal'"),
    ({"max_len": 32}, "max_len: must be >= the 64 space-time tokens"),
])
def test_bad_configs_name_the_field(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_model("vivit", "mini", **settings)


def test_videos_of_the_wrong_shape_are_refused() -> None:
    model = create_model("vivit", "mini")
    with pytest.raises(ValueError, match=r"videos: expected shape \(B, 4, 1, 16, 16\)"):
        model(torch.rand(1, 4, 16, 16))
