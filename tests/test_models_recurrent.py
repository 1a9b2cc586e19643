"""The recurrent mixer (``mixer="lstm"`` / ``"gru"``) in every model kind: shapes, causality,
padding, cached decoding, beam reorder and the errors of what a recurrent block cannot do."""

from __future__ import annotations

import pytest
import torch

from models import TransformerBlock, create_model
from models.recurrent import RecurrentCache, RecurrentMixer

MIXERS = ["lstm", "gru"]
ATOL = 1e-5


def build(kind: str, mixer: str, **overrides):
    """A tiny model of ``kind`` with ``mixer``, seeded, in eval mode."""
    torch.manual_seed(0)
    return create_model(kind, mixer=mixer, **overrides).eval()


def ids(batch: int, length: int, seed: int = 0, low: int = 2) -> torch.Tensor:
    """Random token ids ``(batch, length)`` from the tiny vocabulary (32)."""
    return torch.randint(low, 32, (batch, length), generator=torch.Generator().manual_seed(seed))


def right_mask(lengths: list[int], length: int) -> torch.Tensor:
    """``key_mask (B, N)``: True at the first ``lengths[b]`` positions of row b."""
    return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]


# ----------------------------------------------------------------------------- shapes, build


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_kind_builds_runs_and_trains(mixer):
    """Each kind gives the attention model's output shape, and every parameter (the
    recurrent weights included) gets a finite, non-zero-somewhere gradient."""
    cases = {
        "decoder_lm": ((ids(2, 7),), (2, 7, 32)),
        "encoder_decoder": ((ids(2, 7), ids(2, 5, seed=1)), (2, 5, 32)),
        "encoder_classifier": ((ids(2, 7),), (2, 2)),
        "vit": ((torch.randn(2, 3, 16, 16),), (2, 10)),
    }
    for kind, (inputs, shape) in cases.items():
        model = build(kind, mixer, dropout=0.1).train()
        blocks = model.encoder.blocks if hasattr(model, "encoder") else model.blocks
        assert all(b.self_attn is None and isinstance(b.recurrent, RecurrentMixer) for b in blocks)
        out = model(*inputs)
        assert out.shape == shape, kind
        out.square().mean().backward()
        rnn_grads = [p.grad for b in blocks for p in b.recurrent.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in rnn_grads), kind
        assert any(g.abs().sum() > 0 for g in rnn_grads), kind


@pytest.mark.parametrize("mixer", MIXERS)
def test_encoder_poolings_and_global_tokens(mixer):
    x = ids(2, 6)
    mask = right_mask([6, 4], 6)
    for overrides, shape in [
        (dict(pooling="cls", num_extra_global=2), (2, 3)),
        (dict(pooling="mean"), (2, 3)),
        (dict(pooling="last"), (2, 3)),
        (dict(pooling="tokens", num_extra_global=1), (2, 6, 3)),
    ]:
        model = build("encoder_classifier", mixer, num_classes=3, **overrides)
        assert model(x, mask).shape == shape, overrides
    dual = build("encoder_classifier", mixer, dual=True, pooling="mean")
    assert dual(x, mask, pair_ids=ids(2, 5, seed=3)).shape == (2, 2)
    vit = build("vit", mixer, num_extra_global=1)
    assert vit(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_encoder_is_bidirectional_and_decoder_unidirectional():
    """Direction and width follow the block: D // 2 per direction in an encoder, D in a decoder."""
    enc = build("encoder_decoder", "lstm")
    for block in enc.encoder.blocks:
        assert block.recurrent.rnn.bidirectional and block.recurrent.rnn.hidden_size == 16
    for block in enc.decoder_blocks:
        assert not block.recurrent.rnn.bidirectional and block.recurrent.rnn.hidden_size == 32
        assert block.cross_attn is not None  # cross-attention stays attention


def test_parameter_count_in_the_attention_models_range():
    for kind in ("decoder_lm", "encoder_classifier", "encoder_decoder", "vit"):
        base = sum(p.numel() for p in build(kind, "attention").parameters())
        for mixer in MIXERS:
            count = sum(p.numel() for p in build(kind, mixer).parameters())
            assert 0.5 * base < count < 2.0 * base, (kind, mixer, count, base)


# ----------------------------------------------------------------------------- causality


@pytest.mark.parametrize("mixer", MIXERS)
def test_causal_decoder_sees_no_future(mixer):
    """Changing token t changes no logit before t (and does change the logit at t)."""
    model = build("decoder_lm", mixer, num_layers=2)
    x = ids(1, 9)
    t = 5
    y = x.clone()
    y[0, t] = (x[0, t] + 7) % 32
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=0, rtol=0)
    assert not torch.allclose(a[:, t], b[:, t])


@pytest.mark.parametrize("mixer", MIXERS)
def test_encoder_decoder_target_sees_no_future(mixer):
    model = build("encoder_decoder", mixer)
    src, tgt = ids(1, 6), ids(1, 8, seed=1)
    t = 4
    tgt2 = tgt.clone()
    tgt2[0, t] = (tgt[0, t] + 5) % 32
    with torch.no_grad():
        a, b = model(src, tgt), model(src, tgt2)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=0, rtol=0)
    assert not torch.allclose(a[:, t], b[:, t])


@pytest.mark.parametrize("mixer", MIXERS)
def test_encoder_reads_both_directions(mixer):
    """The bidirectional encoder's first position depends on the last token (it is not causal)."""
    model = build("encoder_classifier", mixer, pooling="tokens")
    x = ids(1, 7)
    y = x.clone()
    y[0, -1] = (x[0, -1] + 3) % 32
    with torch.no_grad():
        assert not torch.allclose(model(x)[:, 0], model(y)[:, 0])


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("mixer", MIXERS)
def test_padding_leaves_real_positions_unchanged(mixer):
    """A right-padded batch equals each sequence run alone, for every kind that takes a mask;
    the garbage in the padding (random ids) must not matter in either direction."""
    lengths, n = [4, 7, 2], 7  # unsorted: packing must restore the order
    x = ids(3, n, seed=4)
    mask = right_mask(lengths, n)
    lm = build("decoder_lm", mixer)
    enc = build("encoder_classifier", mixer, pooling="tokens", num_classes=3)
    cls = build("encoder_classifier", mixer, pooling="cls", num_extra_global=2)
    mean = build("encoder_classifier", mixer, pooling="mean")
    with torch.no_grad():
        out_lm, out_enc = lm(x, mask), enc(x, mask)
        out_cls, out_mean = cls(x, mask), mean(x, mask)
        for b, length in enumerate(lengths):
            alone = x[b : b + 1, :length]
            torch.testing.assert_close(out_lm[b, :length], lm(alone)[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(out_enc[b, :length], enc(alone)[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(out_cls[b], cls(alone)[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(out_mean[b], mean(alone)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("mixer", MIXERS)
def test_encoder_decoder_padding_on_both_sides(mixer):
    model = build("encoder_decoder", mixer)
    src, tgt = ids(2, 8, seed=5), ids(2, 6, seed=6)
    src_lengths, tgt_lengths = [3, 8], [6, 4]
    src_mask, tgt_mask = right_mask(src_lengths, 8), right_mask(tgt_lengths, 6)
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask)
        for b in range(2):
            s, t = src_lengths[b], tgt_lengths[b]
            alone = model(src[b : b + 1, :s], tgt[b : b + 1, :t])[0]
            torch.testing.assert_close(out[b, :t], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_mixer_zeroes_padding_and_rejects_left_padding(causal):
    torch.manual_seed(0)
    layer = RecurrentMixer(8, "lstm", causal=causal)
    x = torch.randn(2, 5, 8)
    mask = right_mask([5, 2], 5)
    out = layer(x, causal=causal, key_mask=mask)  # (B, N, D)
    assert out.shape == (2, 5, 8)
    assert torch.equal(out[1, 2:], torch.zeros(3, 8))
    assert out[1, :2].abs().sum() > 0
    empty = layer(x, causal=causal, key_mask=right_mask([5, 0], 5))  # an all-padding row
    assert torch.equal(empty[1], torch.zeros(5, 8))
    with pytest.raises(ValueError, match="^key_mask:.*right padding"):
        layer(x, causal=causal, key_mask=mask.flip(1))


# ----------------------------------------------------------------------------- cached decoding


@pytest.mark.parametrize("mixer", MIXERS)
def test_mixer_in_pieces_equals_whole(mixer):
    torch.manual_seed(0)
    layer = RecurrentMixer(8, mixer, causal=True)
    x = torch.randn(3, 10, 8)
    whole = layer(x, causal=True)
    cache = layer.new_cache()
    pieces = [layer(x[:, a:b], causal=True, cache=cache) for a, b in [(0, 4), (4, 5), (5, 10)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=ATOL, rtol=0)
    assert cache.length == 10 and cache.h.shape == (1, 3, 8)
    assert (cache.c is not None) == (mixer == "lstm")


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_decoder_lm_cached_pieces_equal_full_forward(mixer, norm):
    model = build("decoder_lm", mixer, norm=norm)
    seq = ids(2, 11, seed=7)
    cache = model.new_cache()
    with torch.no_grad():
        full = model(seq)
        parts = [model(seq[:, a:b], cache=cache) for a, b in [(0, 5), (5, 6), (6, 9), (9, 11)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)
    assert cache.length == 11


@pytest.mark.parametrize("mixer", MIXERS)
def test_encoder_decoder_cached_pieces_equal_full_forward(mixer):
    model = build("encoder_decoder", mixer)
    src, tgt = ids(2, 7, seed=8), ids(2, 9, seed=9)
    src_mask = right_mask([7, 5], 7)
    with torch.no_grad():
        full = model(src, tgt, src_mask)
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        parts = [model.decode(tgt[:, a:b], memory, src_mask, cache=cache) for a, b in [(0, 3), (3, 4), (4, 9)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mixer", MIXERS)
def test_generate_with_and_without_cache_agree(mixer):
    """Greedy and beam search decode the same tokens through the state cache as by rerunning
    the whole sequence (beam search reorders the recurrent state every step)."""
    lm = build("decoder_lm", mixer)
    prompt = ids(2, 4, seed=10)
    seq2seq = build("encoder_decoder", mixer)
    src = ids(2, 6, seed=11)
    src_mask = right_mask([6, 4], 6)
    for strategy in ("greedy", "beam"):
        kw = dict(strategy=strategy, beam_width=3)
        assert torch.equal(lm.generate(prompt, 8, **kw), lm.generate(prompt, 8, use_cache=False, **kw))
        cached = seq2seq.generate(src, 8, src_key_mask=src_mask, **kw)
        uncached = seq2seq.generate(src, 8, src_key_mask=src_mask, use_cache=False, **kw)
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize("mixer", MIXERS)
def test_reorder_selects_the_right_state(mixer):
    """After ``reorder(index)`` the cache continues row ``index[i]``'s sequence in row i."""
    model = build("decoder_lm", mixer)
    seq = ids(3, 6, seed=12)
    index = torch.tensor([2, 0, 0, 1])
    cache = model.new_cache()
    with torch.no_grad():
        model(seq[:, :5], cache=cache)
        cache.reorder(index)
        assert all(layer.h.shape[1] == 4 for layer in cache.layers)
        step = model(seq[index, 5:], cache=cache)[:, -1]
        reference = model(seq[index])[:, -1]
    torch.testing.assert_close(step, reference, atol=ATOL, rtol=0)
    empty = RecurrentCache()
    empty.reorder(index)  # nothing stored yet: a no-op
    assert empty.state is None


# ----------------------------------------------------------------------------- errors


def test_bad_mixer_names_the_field_and_allowed_values():
    expected = r"^mixer: unknown value 'rnn'; allowed values are \['attention', 'lstm', 'gru'\]"
    for kind in ("decoder_lm", "encoder_classifier", "encoder_decoder", "vit"):
        with pytest.raises(ValueError, match=expected):
            create_model(kind, mixer="rnn")
    with pytest.raises(ValueError, match="^mixer:.*allowed values"):
        TransformerBlock(8, 2, 16, mixer="transformer")


def test_odd_width_names_d_model():
    with pytest.raises(ValueError, match="^d_model:.*even"):
        create_model("encoder_classifier", mixer="lstm", d_model=15, num_heads=1)
    with pytest.raises(ValueError, match="^d_model:.*even"):
        RecurrentMixer(15, "gru", causal=False)
    # a decoder's layer is unidirectional: any width will do
    assert build("decoder_lm", "gru", d_model=15, num_heads=1)(ids(1, 3)).shape == (1, 3, 32)


def test_recurrent_decoder_needs_no_causal_attention():
    """The unused self-attention setting need not have a causal form (nystrom has none)."""
    with pytest.raises(ValueError, match="^attention:"):
        create_model("decoder_lm", attention="nystrom")
    assert create_model("decoder_lm", attention="nystrom", mixer="lstm")(ids(1, 4)).shape == (1, 4, 32)
    assert create_model("encoder_decoder", attention="nystrom", mixer="gru")(ids(1, 4), ids(1, 3)).shape == (1, 3, 32)


def test_direction_mismatch_raises():
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8)
    encoder_block = TransformerBlock(8, 2, 16, mixer="lstm", causal=False)
    with pytest.raises(ValueError, match="^mixer:.*bidirectional"):
        encoder_block(x, causal=True)  # would leak the future: refused
    with pytest.raises(ValueError, match="^mixer:"):
        encoder_block.new_cache()
    decoder_block = TransformerBlock(8, 2, 16, mixer="gru", causal=True)
    with pytest.raises(ValueError, match="^mixer:.*unidirectional"):
        decoder_block(x, causal=False)
    assert decoder_block(x, causal=True).shape == (1, 4, 8)


def test_recurrent_cache_rules():
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, 16, mixer="lstm", causal=True)
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="^key_mask:"):
        block(x, causal=True, key_mask=torch.ones(1, 4, dtype=torch.bool), cache=block.new_cache())
    attention_block = TransformerBlock(8, 2, 16)
    with pytest.raises(ValueError, match="^cache:"):
        block(x, causal=True, cache=attention_block.new_cache())


def test_attention_only_seams_name_the_mixer():
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, 16, mixer="gru", causal=False)
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="^mixer: self_attention_inputs"):
        block.self_attention_inputs(x)
    with pytest.raises(ValueError, match="^mixer: finish"):
        block.finish(x, x, x, x)
    with pytest.raises(ValueError, match="^mixer: forward_last"):
        block.forward_last(x)
    model = create_model("encoder_classifier", mixer="lstm", position="none")
    with pytest.raises(ValueError, match="^mixer:"):
        model.stream(window=4)


def test_attention_mixer_is_unchanged():
    block = TransformerBlock(8, 2, 16)
    assert block.recurrent is None and block.self_attn is not None
    assert create_model("decoder_lm").config.mixer == "attention"
