"""Every registered attention in every model kind: forward, backward, padding invariance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attn
from attn import attention_info, list_attention
from models import create_model, list_models


def variant_cases() -> list[tuple[str, dict]]:
    """(name, first example params) of every registered attention: new variants join for free."""
    return [(name, dict(attn.attention_info(name).example_params[0])) for name in attn.list_attention()]


def model_inputs(kind: str, model, batch: int = 2, length: int = 11) -> tuple:
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    if kind == "vit":
        shape = (batch, cfg.in_channels, cfg.image_size, cfg.image_size)
        return (torch.randn(shape, generator=gen),)
    if kind == "vivit":
        shape = (batch, cfg.frames, cfg.in_channels, cfg.image_size, cfg.image_size)
        return (torch.randn(shape, generator=gen),)
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=gen)
    if kind == "encoder_decoder":
        return ids, torch.randint(0, cfg.vocab_size, (batch, length - 3), generator=gen)
    return (ids,)


@pytest.mark.parametrize(("name", "params"), variant_cases(), ids=lambda v: str(v))
@pytest.mark.parametrize("kind", list_models())
def test_every_variant_runs_forward_and_backward(kind, name, params):
    supports_causal = attn.attention_info(name).supports_causal
    if kind in ("decoder_lm", "encoder_decoder") and not supports_causal:
        with pytest.raises(ValueError, match="^attention:"):
            create_model(kind, attention=name, attention_params=params)
        return
    if kind == "vivit" and "positions_per_frame" in params:  # a grid variant: the frame is the model's
        params = {k: v for k, v in params.items() if k != "positions_per_frame"}
    torch.manual_seed(0)
    model = create_model(kind, attention=name, attention_params=params, dropout=0.1)
    inputs = model_inputs(kind, model)
    out = model(*inputs)
    cfg = model.config
    if kind == "decoder_lm":
        expected = (2, 11, cfg.vocab_size)
    elif kind == "encoder_decoder":
        expected = (2, 8, cfg.vocab_size)
    else:
        expected = (2, cfg.num_classes)
    assert out.shape == expected
    out.float().square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_block_styles(norm, activation):
    model = create_model("decoder_lm", norm=norm, activation=activation)
    assert model(torch.randint(0, 32, (2, 5))).shape == (2, 5, 32)


# nystrom is left out: its segment landmarks depend on the padded length N, so padding
# changes the approximation even though padded keys are excluded from every mean.
EXACT = [(n, p) for n, p in variant_cases() if attn.attention_info(n).exact]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize(("name", "params"), EXACT, ids=lambda v: str(v))
def test_padding_does_not_change_encoder_prediction(name, params, pooling):
    torch.manual_seed(0)
    model = create_model(
        "encoder_classifier", attention=name, attention_params=params, pooling=pooling,
        position="learned" if name != "relative" else "auto", num_classes=3,
    ).eval()
    ids = torch.randint(1, 32, (2, 7))
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)  # (B, 12)
    key_mask = torch.arange(12)[None, :].expand(2, -1) < 7
    expected = model(ids)
    torch.testing.assert_close(model(padded, key_mask=key_mask), expected, atol=1e-5, rtol=1e-5)


def test_padding_invariance_with_extra_global_tokens():
    torch.manual_seed(0)
    model = create_model(
        "encoder_classifier", attention="global_tokens",
        attention_params={"num_global": 3, "window": 1}, num_extra_global=2,
    ).eval()
    ids = torch.randint(1, 32, (3, 6))
    padded = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    key_mask = torch.arange(10)[None, :].expand(3, -1) < 6
    torch.testing.assert_close(model(padded, key_mask=key_mask), model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_vit_with_extra_global_tokens(pooling):
    model = create_model(
        "vit", attention="global_tokens", attention_params={"num_global": 3, "window": 2},
        num_extra_global=2, pooling=pooling,
    )
    assert model.prefix.count == 2 + (pooling == "cls")
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_dual_encoder_for_retrieval():
    model = create_model("encoder_classifier", dual=True, pooling="mean").eval()
    a, b = torch.randint(0, 32, (2, 9)), torch.randint(0, 32, (2, 6))
    logits = model(a, pair_ids=b)
    assert logits.shape == (2, 2)
    assert model.embed(a).shape == (2, 32)
    with pytest.raises(ValueError, match="^pair_ids:"):
        model(a)


def test_vit_rejects_wrong_image_shape():
    model = create_model("vit")
    with pytest.raises(ValueError, match="^images:"):
        model(torch.randn(2, 3, 8, 8))


def test_attention_kernel_override_matches_auto():
    torch.manual_seed(0)
    auto = create_model("decoder_lm", attention="sliding_window", attention_params={"window": 2})
    ref = create_model(
        "decoder_lm", attention="sliding_window", attention_params={"window": 2},
        attention_kernel="reference",
    )
    ref.load_state_dict(auto.state_dict())
    assert ref.blocks[0].self_attn.attention.kernel == "reference"
    ids = torch.randint(0, 32, (2, 9))
    torch.testing.assert_close(ref.eval()(ids), auto.eval()(ids), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="^attention_kernel:"):
        create_model("decoder_lm", attention_kernel="no_such_kernel")


# A training step of every built-in variant under bf16 autocast on the CPU (CPU autocast recasts the
# ops CUDA's does): the loss finite, every weight float32 and moved, the gradients finite.
BUILTIN = ("full", "causal", "sliding_window", "dilated", "global_tokens", "nystrom", "relative")


def _cases() -> list[tuple[str, dict]]:
    assert set(BUILTIN) <= set(list_attention())
    return [(name, dict(params)) for name in BUILTIN
            for params in (attention_info(name).example_params or ({},))]


def _step(model: torch.nn.Module, inputs: torch.Tensor, target: torch.Tensor) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    optimizer.step()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name  # autocast never changes the weights' dtype
        if name in grads and grads[name].abs().sum() > 0:
            assert not torch.equal(p.detach(), before[name]), f"{name} did not move"
    return float(loss.detach())


@pytest.mark.parametrize(("name", "params"), _cases(),
                         ids=lambda v: v if isinstance(v, str) else ",".join(map(str, v.values())))
def test_an_encoder_training_step_under_bf16_autocast(name: str, params: dict) -> None:
    torch.manual_seed(0)
    model = create_model("encoder_classifier", "mini", attention=name, attention_params=params,
                         vocab_size=20, num_classes=3, max_len=72)
    ids = torch.randint(1, 20, (2, 64))
    assert torch.isfinite(torch.tensor(_step(model, ids, torch.tensor([0, 2]))))


@pytest.mark.parametrize(("name", "params"),
                         [c for c in _cases() if attention_info(c[0]).supports_causal],
                         ids=lambda v: v if isinstance(v, str) else ",".join(map(str, v.values())))
def test_a_decoder_training_step_under_bf16_autocast(name: str, params: dict) -> None:
    torch.manual_seed(0)
    model = create_model("decoder_lm", "mini", attention=name, attention_params=params,
                         vocab_size=20, max_len=72)
    ids = torch.randint(0, 20, (2, 65))
    assert torch.isfinite(torch.tensor(_step(model, ids[:, :-1], ids[:, 1:])))
