"""A training step of every built-in variant under bf16 autocast, on the CPU.

Quality training on CUDA wraps each step in ``torch.autocast("cuda", dtype=torch.bfloat16)``
(``bench.quality.trainer.Trainer.autocast``); CPU autocast to bfloat16 recasts the same ops
(``mm``, ``bmm``, ``addmm``, ``baddbmm``), so a step that breaks or goes non-finite there
would break on a GPU. Each variant's example parameter sets are trained one step in the
encoder classifier, and the causal-capable ones in the decoder: the loss is finite, every
weight that gets a gradient stays float32 and moves, and the gradients are finite.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn import attention_info, list_attention
from models import create_model

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
