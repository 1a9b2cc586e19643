"""A decoder LM on packed rows (``document_ids``) gives the logits of each document run alone."""

from __future__ import annotations

import pytest
import torch

from models import create_model

LENGTHS = ((5, 1, 7), (13,))  # per row: document lengths (a one-token document)


@pytest.mark.parametrize(("attention", "params", "position"), [
    ("causal", {}, "learned"), ("sliding_window", {"window": 2}, "rope"),
    ("global_tokens", {"num_global": 2, "window": 1}, "learned"),
])
def test_packed_decoder_rows_equal_their_documents_alone(attention, params, position) -> None:
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention=attention, attention_params=params, position=position).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (len(LENGTHS), 13), generator=torch.Generator().manual_seed(1))
    document_ids = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in LENGTHS])
    with torch.no_grad():
        packed = model(ids, document_ids=document_ids)  # (B, N, V)
        for b, lengths in enumerate(LENGTHS):
            start = 0
            for length in lengths:
                alone = model(ids[b : b + 1, start : start + length])  # (1, n_d, V)
                torch.testing.assert_close(packed[b : b + 1, start : start + length], alone,
                                           atol=1e-5, rtol=1e-5)
                start += length


def test_packed_decoder_refuses_a_cache_or_a_key_mask() -> None:
    model = create_model("decoder_lm")
    ids = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="document_ids: packed rows take no cache and no key_mask"):
        model(ids, key_mask=torch.ones(1, 4, dtype=torch.bool), document_ids=torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="argument 'document_ids' must be non-decreasing"):
        model(ids, document_ids=torch.tensor([[0, 1, 0, 1]]))
