"""Decoding: KV cache exactness, greedy, beam search, sampling."""

from __future__ import annotations

import math

import pytest
import torch
from selection import first_of_each

import attn
from models import beam_search, create_model, greedy_search


def causal_cases() -> list:
    """Every example parameter set of every attention with a causal form (the first of each
    variant in the default run, the others ``slow``)."""
    return first_of_each(
        (name, dict(params))
        for name in attn.list_attention()
        if attn.attention_info(name).supports_causal
        for params in attn.attention_info(name).example_params
    )


def tiny(kind: str, name: str, params: dict, **overrides):
    torch.manual_seed(0)
    return create_model(kind, attention=name, attention_params=params, **overrides).eval()


@pytest.mark.parametrize(("name", "params"), causal_cases(), ids=lambda v: str(v))
def test_decoder_cached_equals_uncached_equals_full_forward_argmax(name, params):
    model = tiny("decoder_lm", name, params, norm="pre")
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    new = 14  # long enough that banded caches are trimmed
    cached = model.generate(prompt, new, use_cache=True)
    uncached = model.generate(prompt, new, use_cache=False)
    assert torch.equal(cached, uncached)
    # greedy == step-by-step argmax of the full forward
    seq = prompt
    with torch.no_grad():
        for _ in range(new):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, seq)
    # and the cached logits themselves match the full forward
    cache = model.new_cache()
    with torch.no_grad():
        step_logits = [model(seq[:, :5], cache=cache)[:, -1]]
        step_logits += [model(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(5, seq.shape[1] - 1)]
        full = model(seq[:, :-1])[:, 4:]
    torch.testing.assert_close(torch.stack(step_logits, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("name", "params"), causal_cases(), ids=lambda v: str(v))
def test_encoder_decoder_cached_equals_uncached(name, params):
    model = tiny("encoder_decoder", name, params)
    src = torch.randint(2, 32, (2, 9), generator=torch.Generator().manual_seed(2))
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, 6:] = False
    cached = model.generate(src, 12, src_key_mask=key_mask)
    uncached = model.generate(src, 12, src_key_mask=key_mask, use_cache=False)
    assert torch.equal(cached, uncached)
    tgt = cached[:, :1]
    with torch.no_grad():
        for _ in range(12):
            nxt = model(src, tgt, src_key_mask=key_mask)[:, -1].argmax(-1, keepdim=True)
            tgt = torch.cat([tgt, nxt], dim=1)
    assert torch.equal(cached, tgt)


@pytest.mark.parametrize(
    ("name", "params", "bound"),
    [
        ("sliding_window", {"window": 3}, 4),
        ("dilated", {"window": 2, "dilation": 2}, 5),
        ("global_tokens", {"num_global": 2, "window": 3}, 2 + 4),
        ("full", {}, None),
        # a relative bias with global tokens cannot be trimmed exactly: it keeps all
        ("global_tokens", {"num_global": 2, "window": 3, "position_bias": "learned"}, None),
    ],
)
def test_cache_keeps_only_what_the_pattern_needs(name, params, bound):
    model = tiny("decoder_lm", name, params)
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 32, (1, 20)), cache=cache)
        for _ in range(5):
            model(torch.randint(0, 32, (1, 1)), cache=cache)
    stored = cache.layers[0].length
    assert stored == (25 if bound is None else bound)
    assert cache.length == 25


def test_beam_width_one_equals_greedy():
    model = tiny("decoder_lm", "sliding_window", {"window": 3})
    prompt = torch.randint(0, 32, (3, 4))
    greedy = model.generate(prompt, 10)
    for alpha in (0.0, 0.6):
        beam = model.generate(prompt, 10, strategy="beam", beam_width=1, length_penalty=alpha)
        assert torch.equal(beam, greedy)
    model_s2s = tiny("encoder_decoder", "full", {})
    src = torch.randint(2, 32, (2, 6))
    assert torch.equal(
        model_s2s.generate(src, 8, strategy="beam", beam_width=1, eos_id=0),
        model_s2s.generate(src, 8, eos_id=0),
    )


class TableSession:
    """A crafted LM (the seeds' yes/ok/</s> search tree): next-token log-probs depend only
    on the previous token. Greedy takes 'yes' (0.5) first, then is stuck with flat choices;
    'ok' (0.4) leads to 'ok' (0.9): the better total."""

    YES, OK, EOS = 0, 1, 2
    START = 3

    def __init__(self) -> None:
        table = torch.full((4, 4), 1e-9)
        table[self.START, [self.YES, self.OK, self.EOS]] = torch.tensor([0.5, 0.4, 0.1])
        table[self.YES, [self.YES, self.OK, self.EOS]] = torch.tensor([0.4, 0.3, 0.3])
        table[self.OK, [self.YES, self.OK, self.EOS]] = torch.tensor([0.05, 0.9, 0.05])
        table[self.EOS, self.EOS] = 1.0
        self.logits = table.log()

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits[tokens[:, -1]]

    def reorder(self, index: torch.Tensor) -> None:
        pass


def sequence_logprob(session: TableSession, seq: torch.Tensor) -> float:
    logp = torch.log_softmax(session.logits, dim=-1)
    return float(sum(logp[seq[t - 1], seq[t]] for t in range(1, len(seq))))


def test_wider_beam_never_scores_below_greedy_on_a_crafted_case():
    session = TableSession()
    prefix = torch.tensor([[TableSession.START]])
    greedy = greedy_search(session, prefix, 2)
    assert greedy[0].tolist() == [3, 0, 0]  # yes yes
    greedy_score = sequence_logprob(session, greedy[0])
    one, one_score = beam_search(session, prefix, 2, beam_width=1)
    assert torch.equal(one, greedy)
    assert math.isclose(float(one_score), greedy_score, rel_tol=1e-6)
    for width in (2, 3, 4):
        best, score = beam_search(session, prefix, 2, beam_width=width)
        assert float(score) >= greedy_score
        assert math.isclose(float(score), sequence_logprob(session, best[0]), rel_tol=1e-6)
    best, _ = beam_search(session, prefix, 2, beam_width=2)
    assert best[0].tolist() == [3, 1, 1]  # ok ok: the globally most probable sequence


def test_greedy_stops_at_eos():
    session = TableSession()
    prefix = torch.tensor([[TableSession.START], [TableSession.OK]])
    out = greedy_search(session, prefix, 10, eos_id=TableSession.EOS)
    # row 0: yes yes yes ... never EOS by argmax; row 1 keeps 'ok': no early stop for the batch
    assert out.shape == (2, 11)
    stop = greedy_search(session, torch.tensor([[TableSession.EOS]]), 10, eos_id=TableSession.EOS)
    assert stop.tolist() == [[2, 2]]  # every row finished: decoding stops


@pytest.mark.parametrize(
    ("name", "params"),
    [("full", {}), ("sliding_window", {"window": 2}), ("global_tokens", {"num_global": 1, "window": 1}),
     ("relative", {"bias": "learned", "max_distance": 4})],
    ids=str,
)
def test_beam_cached_equals_uncached(name, params):
    model = tiny("decoder_lm", name, params)
    prompt = torch.randint(3, 32, (2, 4))
    out = model.generate(prompt, 8, strategy="beam", beam_width=3, eos_id=2, length_penalty=0.6)
    assert out.shape[0] == 2 and 5 <= out.shape[1] <= 12
    kwargs = dict(strategy="beam", beam_width=3, eos_id=2)
    cached = model.generate(prompt, 8, **kwargs)
    assert torch.equal(cached, model.generate(prompt, 8, use_cache=False, **kwargs))


def test_sampling_is_seeded_and_respects_top_k():
    model = tiny("decoder_lm", "causal", {})
    prompt = torch.randint(0, 32, (2, 3))
    a = model.generate(prompt, 6, strategy="sample", generator=torch.Generator().manual_seed(0))
    b = model.generate(prompt, 6, strategy="sample", generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (2, 9)
    top1 = model.generate(prompt, 6, strategy="sample", top_k=1)
    assert torch.equal(top1, model.generate(prompt, 6))


def test_bad_strategy_and_training_mode_restored():
    model = tiny("decoder_lm", "full", {}).train()
    with pytest.raises(ValueError, match="^strategy:"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, strategy="nucleus")
    assert model.training
