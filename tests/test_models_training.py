"""Each model kind learns a tiny synthetic task: the loss falls well below its start."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models import create_model

pytestmark = pytest.mark.slow


def train(model, batch_fn, loss_fn, steps: int, lr: float = 3e-3) -> tuple[float, float]:
    """Adam on fresh seeded batches; returns (first loss, mean of the last 5 losses)."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model, *batch_fn(gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], sum(losses[-5:]) / 5


def test_decoder_lm_learns_to_copy():
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention="sliding_window", attention_params={"window": 8})
    half = 6

    def batch(gen):
        x = torch.randint(3, 32, (32, half), generator=gen)
        return (torch.cat([x, torch.full((32, 1), 2), x], dim=1),)  # a SEP a

    def loss(model, seq):
        logits = model(seq[:, :-1])
        return F.cross_entropy(logits[:, half:].reshape(-1, 32), seq[:, half + 1 :].reshape(-1))

    first, last = train(model, batch, loss, steps=250)
    assert last < 0.5 * first and last < 0.5 * math.log(32)  # well below chance, too


def test_encoder_decoder_learns_to_reverse():
    torch.manual_seed(0)
    model = create_model("encoder_decoder", attention="full", norm="pre")

    def batch(gen):
        src = torch.randint(3, 32, (32, 6), generator=gen)
        tgt = torch.cat([torch.full((32, 1), 1), src.flip(1)], dim=1)  # BOS reversed
        return src, tgt

    def loss(model, src, tgt):
        logits = model(src, tgt[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 32), tgt[:, 1:].reshape(-1))

    first, last = train(model, batch, loss, steps=200)
    assert last < 0.5 * first and last < 0.5 * math.log(32)
    out = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), 6)
    assert out.shape == (1, 7)


def test_encoder_classifier_learns_a_synthetic_label():
    torch.manual_seed(0)
    model = create_model(
        "encoder_classifier", attention="global_tokens",
        attention_params={"num_global": 1, "window": 2}, num_classes=4,
    )

    def batch(gen):
        ids = torch.randint(0, 32, (32, 12), generator=gen)
        return ids, ids[:, 0] % 4  # label: the first token's residue

    def loss(model, ids, labels):
        return F.cross_entropy(model(ids), labels)

    first, last = train(model, batch, loss, steps=150)
    assert last < 0.5 * first and last < 0.5 * math.log(4)


def test_vit_learns_where_the_bright_patch_is():
    torch.manual_seed(0)
    # pre-LN, as in the ViT paper; the task needs the learned positions
    model = create_model("vit", attention="full", num_classes=4, in_channels=1, norm="pre")

    def batch(gen):
        labels = torch.randint(0, 4, (32,), generator=gen)
        quadrant = F.one_hot(labels, 4).float().view(32, 1, 2, 2)  # (B, 1, 2, 2)
        bright = F.interpolate(quadrant, scale_factor=8, mode="nearest")  # (B, 1, 16, 16)
        return bright + 0.1 * torch.randn(32, 1, 16, 16, generator=gen), labels

    def loss(model, images, labels):
        return F.cross_entropy(model(images), labels)

    first, last = train(model, batch, loss, steps=100)
    assert last < 0.5 * first and last < 0.5 * math.log(4)
