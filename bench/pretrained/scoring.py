"""Scoring a causal LM's next-token predictions from its final hidden states, a block of positions at a time
(docs/pretrained.md, "The tasks"), and the unigram floor."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

#: positions whose logits are computed at once (1,024 x 49,152 float32: 192 MiB)
LOGIT_BLOCK = 1024


def hidden_states(model: nn.Module, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    """The final hidden states ``(B, N, d)`` of ``ids (B, N)`` (the decoder stack without its output layer)."""
    return model.get_decoder()(input_ids=ids, **kwargs).last_hidden_state


def next_token_nll(model: nn.Module, hidden: torch.Tensor, ids: torch.Tensor,
                   start: int) -> torch.Tensor:
    """``(B, N - start)``: the NLL (nats) of ``ids[:, t]`` predicted at ``t - 1``, every ``t >= start >= 1``."""
    head = model.get_output_embeddings()
    parts = []
    for first in range(start, ids.shape[1], LOGIT_BLOCK):
        last = min(first + LOGIT_BLOCK, ids.shape[1])
        logits = head(hidden[:, first - 1:last - 1]).float()  # (B, L, V)
        parts.append(F.cross_entropy(logits.transpose(1, 2), ids[:, first:last], reduction="none"))
    return torch.cat(parts, dim=1) if parts else ids.new_zeros((ids.shape[0], 0), dtype=torch.float32)


def greedy_matches(model: nn.Module, hidden: torch.Tensor, ids: torch.Tensor,
                   answer: slice) -> torch.Tensor:
    """``(B,)``: whether greedy decoding from ``ids[:, :answer.start]`` writes ``ids[:, answer]``, teacher-forced."""
    logits = model.get_output_embeddings()(hidden[:, answer.start - 1:answer.stop - 1])
    return (logits.argmax(-1) == ids[:, answer]).all(dim=1)


def unigram_nll(tokens: Sequence[int], fit: Sequence[int], vocab_size: int,
                smoothing: float = 0.5) -> float:
    """Mean NLL (nats) of ``tokens`` under the unigram distribution of ``fit``, with add-``smoothing``."""
    counts = Counter(fit)
    total = len(fit) + smoothing * vocab_size
    return -sum(math.log((counts[t] + smoothing) / total) for t in tokens) / len(tokens)


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))
