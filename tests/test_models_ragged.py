"""Prompts of different lengths in one batch (decoder_lm): left padding with a key mask
through the KV cache and per-row positions; each row generates what its prompt alone does."""

from __future__ import annotations

import pytest
import torch

from models import KVCache, create_model, left_pad
from models.attention import pattern_shift_reason

LENGTHS = (5, 2, 7, 3)
VARIANTS = [("full", {}), ("sliding_window", {"window": 2})]


def tiny(position: str, name: str, params: dict, **overrides):
    torch.manual_seed(0)
    return create_model("decoder_lm", attention=name, attention_params=params, position=position,
                        **overrides).eval()


def prompts(seed: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 32, (n,), generator=generator) for n in LENGTHS]


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_ragged_batch_generates_what_each_prompt_generates_alone(strategy, position, name, params):
    model = tiny(position, name, params)
    batch = prompts()
    ids, key_mask = left_pad(batch)  # (4, 7)
    kwargs = {"strategy": strategy, "beam_width": 3, "length_penalty": 0.6} if strategy == "beam" else {}
    new = 9  # past the window: the banded cache is trimmed, its mask with it
    out = model.generate(ids, new, key_mask=key_mask, **kwargs)
    assert out.shape == (4, ids.shape[1] + new)
    assert torch.equal(out[:, : ids.shape[1]], ids)  # the padding is kept
    assert torch.equal(out, model.generate(ids, new, key_mask=key_mask, use_cache=False, **kwargs))
    for b, prompt in enumerate(batch):
        alone = model.generate(prompt[None], new, **kwargs)[0]
        assert torch.equal(out[b, ids.shape[1] - len(prompt) :], alone), f"row {b}"


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_ragged_logits_equal_each_prompt_alone_forward_and_cached(position, name, params):
    """The logits behind the tokens: a left-padded row's real positions give the logits of
    its prompt alone, in the batch forward and through the cache (prefill, then steps)."""
    model = tiny(position, name, params, norm="pre")
    batch = prompts(6)
    ids, key_mask = left_pad(batch)
    steps = torch.randint(3, 32, (4, 6), generator=torch.Generator().manual_seed(7))
    full_ids = torch.cat([ids, steps], dim=1)  # (4, 13)
    full_mask = torch.cat([key_mask, torch.ones(4, 6, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        batch_logits = model(full_ids, full_mask)  # (4, 13, V)
        cache = model.new_cache()
        cached = [model(ids, key_mask, cache=cache)]
        cached += [model(steps[:, t : t + 1], cache=cache) for t in range(6)]
        cached_logits = torch.cat(cached, dim=1)
        for b, prompt in enumerate(batch):
            alone = model(torch.cat([prompt, steps[b]])[None])[0]  # (T_b + 6, V)
            real = full_mask[b]
            torch.testing.assert_close(batch_logits[b, real], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cached_logits[b, real], alone, atol=1e-5, rtol=1e-5)
    stored = cache.layers[0]
    assert stored.mask is not None and stored.mask.shape == (4, stored.length)


def test_sampling_and_eos_with_ragged_prompts():
    model = tiny("rope", "sliding_window", {"window": 2})
    batch = prompts()
    ids, key_mask = left_pad(batch)
    greedy = model.generate(ids, 6, key_mask=key_mask)
    top1 = model.generate(ids, 6, key_mask=key_mask, strategy="sample", top_k=1)
    assert torch.equal(top1, greedy)
    eos = int(greedy[1, -6])  # row 1's first generated token: row 1 ends at once
    stopped = model.generate(ids, 6, key_mask=key_mask, eos_id=eos)
    for b, prompt in enumerate(batch):
        alone = model.generate(prompt[None], 6, eos_id=eos)[0]
        row = stopped[b, ids.shape[1] - len(prompt) :]
        assert torch.equal(row[: len(alone)], alone)
        assert bool((row[len(alone) :] == eos).all())


def test_a_full_key_mask_is_the_unpadded_batch():
    model = tiny("sinusoidal", "full", {})
    ids = torch.randint(3, 32, (2, 4))
    assert torch.equal(model.generate(ids, 5, key_mask=torch.ones(2, 4, dtype=torch.bool)),
                       model.generate(ids, 5))


def test_kv_cache_keeps_the_mask_of_its_keys():
    """A growing cache stores the key mask beside the keys: a masked key stays masked for
    later queries, unmasked calls append real keys, and trimming keeps the two aligned."""
    cache = KVCache(keep_first=0, keep_last=3)
    k = torch.randn(2, 1, 4, 2)
    mask = torch.tensor([[False, True, True, True], [False, False, True, True]])
    _, _, got = cache.update(k, k, mask)
    assert torch.equal(got, mask) and torch.equal(cache.mask, mask[:, 1:])
    _, _, got = cache.update(k[:, :, :1], k[:, :, :1])
    assert torch.equal(got[:, -1], torch.tensor([True, True])) and cache.mask.shape == (2, 3)
    assert cache.seen == 5
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.mask[0], cache.mask[1])
    plain = KVCache()
    assert plain.update(k, k)[2] is None
    with pytest.raises(ValueError, match=r"^key_mask: must be a bool tensor of shape \(2, 4\)"):
        KVCache().update(k, k, torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    ("mask", "words"),
    [
        (torch.tensor([[True, True, False], [True, True, True]]), "must be left-padded"),
        (torch.tensor([[False, True, False], [True, True, True]]), "must be left-padded"),
        (torch.tensor([[False, False, False], [True, True, True]]), "at least one real token"),
        (torch.ones(2, 2, dtype=torch.bool), "must be a bool tensor of the prompts' shape"),
        (torch.ones(2, 3), "must be a bool tensor of the prompts' shape"),
    ],
    ids=["right-padded", "hole", "empty-row", "shape", "dtype"],
)
def test_bad_key_masks_are_named(mask, words):
    model = tiny("sinusoidal", "full", {})
    with pytest.raises(ValueError, match=f"^key_mask: .*{words}") as err:
        model.generate(torch.randint(3, 32, (2, 3)), 2, key_mask=mask)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"attention": "global_tokens", "attention_params": {"num_global": 1, "window": 2}},
         "global, an absolute position"),
        ({"attention": "full", "mixer": "gru"}, "allowed: mixer='attention'"),
    ],
    ids=["global_tokens", "recurrent"],
)
def test_ragged_prompts_refuse_what_left_padding_would_change(overrides, words):
    torch.manual_seed(0)
    model = create_model("decoder_lm", **overrides).eval()
    ids, key_mask = left_pad(prompts())
    with pytest.raises(ValueError, match=f"^key_mask: .*{words}"):
        model.generate(ids, 2, key_mask=key_mask)


def test_left_pad_and_its_errors():
    ids, key_mask = left_pad([torch.tensor([4, 5, 6]), torch.tensor([7])], pad_id=1)
    assert ids.tolist() == [[4, 5, 6], [1, 1, 7]]
    assert key_mask.tolist() == [[True, True, True], [False, False, True]]
    with pytest.raises(ValueError, match="^prompts: must be a non-empty list"):
        left_pad([])
    with pytest.raises(ValueError, match="^prompts: must be 1-D token id tensors.*prompt 1"):
        left_pad([torch.tensor([1]), torch.tensor([], dtype=torch.long)])


class _Pattern:
    """A stand-in attention with only what :func:`pattern_shift_reason` reads."""

    num_heads = 2

    def __init__(self, mask_mod=None, score_mod=None) -> None:
        self._mask_mod, self._score_mod = mask_mod, score_mod

    def band(self) -> None:
        return None

    def parameters(self) -> list:
        return []

    def buffers(self) -> list:
        return []

    def mask_mod(self):
        return self._mask_mod

    def score_mod(self):
        return self._score_mod


def test_the_shift_probe_catches_absolute_masks_and_scores():
    """A pattern that reads absolute positions (a plug-in's, say) is found by the probe, in
    its mask or its score term; patterns of ``j - i`` pass."""
    assert pattern_shift_reason(_Pattern()) is None
    assert pattern_shift_reason(_Pattern(lambda b, h, i, j: (i - j).abs() <= 2)) is None
    assert pattern_shift_reason(_Pattern(score_mod=lambda s, b, h, i, j: s - (i - j).abs() * (h + 1))) is None
    assert "mask_mod" in pattern_shift_reason(_Pattern(lambda b, h, i, j: j >= 3))
    assert "score_mod" in pattern_shift_reason(_Pattern(score_mod=lambda s, b, h, i, j: s + j))
