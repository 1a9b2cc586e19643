"""Passkey retrieval prompts (Mohtashami and Jaggi 2023; docs/pretrained.md, "The tasks"): a 5-digit key stated
once at a chosen depth of N tokens of filler, asked for at the end."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
         "Find it and memorise it. I will quiz you about it.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt: ``ids`` (prompt then answer), where the answer lies, the key and where the needle starts."""

    ids: list[int]
    answer: slice
    key: str
    needle_at: int


def build_prompt(encode: Encode, seq_len: int, depth: float, key: str) -> PasskeyPrompt:
    """A prompt of exactly ``seq_len`` tokens, its needle at about ``depth`` (0..1) of the filler, at a sentence
    boundary; ``ValueError`` when ``seq_len`` cannot hold the fixed parts."""
    intro, needle = encode(INTRO), encode(NEEDLE.format(key=key))
    question, answer = encode(QUESTION), encode(ANSWER.format(key=key))
    unit = encode(FILLER)
    room = seq_len - len(intro) - len(needle) - len(question) - len(answer)
    if room < len(unit):
        raise ValueError(f"seq_len: a passkey prompt needs more than "
                         f"{seq_len - room + len(unit)} tokens; got {seq_len}")
    filler = (unit * (room // len(unit) + 1))[:room]
    cut = round(depth * (room // len(unit))) * len(unit)  # a whole number of filler sentences
    ids = [*intro, *filler[:cut], *needle, *filler[cut:], *question, *answer]
    start = len(ids) - len(answer)
    return PasskeyPrompt(ids, slice(start, len(ids)), key, len(intro) + cut)


def keys_for(seq_len: int, depth: float, count: int, seed: int) -> list[str]:
    """``count`` distinct 5-digit keys for the cell (``seq_len``, ``depth``), the same in every run and pattern."""
    rng = random.Random(f"{seed}:{seq_len}:{depth:.4f}")
    return [str(k) for k in rng.sample(range(10_000, 100_000), count)]
