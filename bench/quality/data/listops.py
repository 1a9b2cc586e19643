"""ListOps expressions such as ``[MAX 2 9 [MIN 4 7 ] 0 ]`` labelled with their value, sampled draw for draw as
the Long Range Arena does (Tay et al. 2021); LRA's parentheses carry nothing and its pipeline drops them, so
they are left out unless ``parens=True``."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from attn.validation import invalid, require_int
from bench.quality.data.cache import load_or_generate_npz

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS: tuple[str, ...] = (MIN, MAX, MED, SUM_MOD)
DIGITS: tuple[str, ...] = tuple(str(v) for v in range(10))
PAD = "<pad>"

#: Token vocabulary; the id of a token is its index. ``"<pad>"`` is id 0.
VOCAB: tuple[str, ...] = (PAD, *OPERATORS, END, "(", ")", *DIGITS)
TOKEN_TO_ID: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB)}

_VALUE_P = 0.25  # LRA: probability of an operator node below max_depth

#: Bump when the generator's output for the same arguments changes (invalidates caches).
VERSION = 1


def generate(
    num_examples: int,
    *,
    seed: int,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 0,
    max_length: int = 2000,
    parens: bool = False,
    unique: bool = True,
    max_attempts: int | None = None,
) -> tuple[list[list[str]], np.ndarray]:
    """``(token_lists, labels)`` of ``num_examples`` expressions of ``min_length`` to ``max_length`` tokens,
    distinct with ``unique`` (as LRA); ``max_attempts`` bounds the trees tried."""
    require_int("num_examples", num_examples, minimum=0)
    require_int("max_depth", max_depth, minimum=1)
    require_int("max_args", max_args, minimum=2)
    if max_depth > 200:
        raise invalid("max_depth", f"must be at most 200; got {max_depth}")
    if not 0 <= min_length <= max_length:
        raise invalid(
            "min_length, max_length", f"must satisfy 0 <= min_length <= max_length; got {min_length}, {max_length}"
        )
    attempts_left = max(100_000, 1000 * num_examples) if max_attempts is None else max_attempts

    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    token_lists: list[list[str]] = []
    labels: list[int] = []
    while len(token_lists) < num_examples:
        if attempts_left <= 0:
            raise ValueError(
                f"could not sample {num_examples} {'distinct ' if unique else ''}expressions with "
                f"min_length={min_length}, max_length={max_length}, max_depth={max_depth}, max_args={max_args} "
                f"(got {len(token_lists)}); widen the length range or raise max_attempts"
            )
        attempts_left -= 1
        tokens: list[str] = []
        value = _sample_tree(rng, 1, max_depth, max_args, parens, tokens, max_length)
        if value is None or not min_length <= len(tokens) <= max_length:
            continue
        if unique:
            key = tuple(tokens)
            if key in seen:
                continue
            seen.add(key)
        token_lists.append(tokens)
        labels.append(value)
    return token_lists, np.asarray(labels, dtype=np.int64).reshape(-1)


def _sample_tree(
    rng: random.Random, depth: int, max_depth: int, max_args: int, parens: bool, out: list[str], limit: int
) -> int | None:
    """Append one subtree's tokens to ``out`` (random draws in LRA's order); its value, None over ``limit``."""
    r = rng.random() if depth < max_depth else 1.0
    if r > _VALUE_P:
        value = rng.choice(range(10))
        out.append(DIGITS[value])
        return value
    num_args = rng.randint(2, max_args)
    start = len(out)
    out.append("")  # operator placeholder, chosen after the arguments as in LRA
    args: list[int] = []
    for i in range(num_args):
        if parens and i > 0:
            out.append(")")
        arg = _sample_tree(rng, depth + 1, max_depth, max_args, parens, out, limit)
        if arg is None:
            return None
        args.append(arg)
        if len(out) > limit:  # already too long: stop early (the sample is rejected anyway)
            return None
    op = rng.choice(OPERATORS)
    out[start] = op
    if parens:
        # LRA's to_string nests left-associatively: ( ( ( op a1 ) a2 ) ] ) for two arguments.
        out[start:start] = ["("] * (num_args + 1)
        out.append(")")
        out.append(END)
        out.append(")")
    else:
        out.append(END)
    return _apply(op, args)


def _apply(op: str, args: Sequence[int]) -> int:
    if op == MAX:
        return max(args)
    if op == MIN:
        return min(args)
    if op == MED:
        ordered = sorted(args)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        return (ordered[mid - 1] + ordered[mid]) // 2  # int(np.median(...)) for non-negative ints
    if op == SUM_MOD:
        return sum(args) % 10
    raise ValueError(f"unknown operator {op!r}; allowed: {', '.join(OPERATORS)}")


def evaluate_tokens(tokens: Sequence[str]) -> int:
    """Value (0..9) of one expression given as tokens (parentheses ignored); ValueError if malformed."""
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for position, tok in enumerate(tokens):
        if tok in ("(", ")"):
            continue
        if result is not None:
            raise ValueError(f"trailing token {tok!r} at position {position} after a complete expression")
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == END:
            if not stack or not stack[-1][1]:
                raise ValueError(f"unexpected ']' at position {position}")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok in DIGITS:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown token {tok!r} at position {position}; allowed: {', '.join(VOCAB[1:])}")
    if stack or result is None:
        raise ValueError("incomplete expression (unclosed operator or no tokens)")
    return result


def encode(token_lists: Sequence[Sequence[str]], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, key_mask)`` right-padded to ``seq_len``; a longer example is an error (cut, its value changes)."""
    require_int("seq_len", seq_len, minimum=1)
    ids = np.zeros((len(token_lists), seq_len), dtype=np.int64)
    mask = np.zeros((len(token_lists), seq_len), dtype=bool)
    for row, tokens in enumerate(token_lists):
        if len(tokens) > seq_len:
            raise ValueError(f"example {row} has {len(tokens)} tokens, more than seq_len={seq_len}")
        try:
            ids[row, : len(tokens)] = [TOKEN_TO_ID[tok] for tok in tokens]
        except KeyError as err:
            raise ValueError(f"example {row} has unknown token {err.args[0]!r}; allowed: {VOCAB[1:]}") from None
        mask[row, : len(tokens)] = True
    return ids, mask


def load_or_generate(
    num_examples: int, *, seed: int, seq_len: int, **params: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, key_mask, labels)``: :func:`generate` then :func:`encode`, cached (``max_length`` defaults to
    ``seq_len``)."""
    params = {"max_length": seq_len, **params}
    key = {"num_examples": num_examples, "seed": seed, "seq_len": seq_len, **params}

    def build() -> dict[str, np.ndarray]:
        tokens, labels = generate(num_examples, seed=seed, **params)
        ids, mask = encode(tokens, seq_len)
        return {"ids": ids, "key_mask": mask, "labels": labels}

    arrays = load_or_generate_npz("listops", key, VERSION, build)
    return arrays["ids"], arrays["key_mask"], arrays["labels"]
