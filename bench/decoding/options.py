"""The options of ``attn-bench decoding``, shared by the CLI and the benchmark (no torch: the CLI reads them at
start-up)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from attn.validation import require_choice, require_choices, require_int

_MINIMUM = {"window": 0, "vocab_size": 2}
#: the devices ``--device`` takes (as :data:`bench.engine.config.DEVICES`)
DEVICES = ("cpu", "cuda")
BENCHMARKS = ("decoding", "streaming")
_NOT_INTEGERS = ("attention", "device", "benchmark")


def _at_least(option: str, values: Any, minimum: int) -> None:
    """Each of ``values`` (one value, a sequence, or None) is an integer >= ``minimum``."""
    if values is None:
        return
    for value in values if isinstance(values, (list, tuple)) else [values]:
        require_int(option, value, minimum=minimum)


@dataclass(frozen=True)
class DecodingOptions:
    benchmark: tuple[str, ...] = BENCHMARKS  # which benchmarks run
    context: tuple[int, ...] = (1024, 4096)  # prompt lengths
    new_tokens: int = 32  # tokens generated per call
    attention: tuple[str, ...] = ("full",)  # decoder attentions (causal ones)
    window: int = 256  # window of banded attentions
    d_model: int = 256
    num_heads: int = 4
    num_kv_heads: tuple[int, ...] | None = None  # grouped-query heads, each measured; None: num_heads
    num_layers: int = 4
    d_ff: int = 1024
    vocab_size: int = 256
    stream_window: tuple[int, ...] = (256, 1024)  # streaming windows
    stream_layers: tuple[int, ...] = (1, 2)  # streaming encoder depths
    stream_steps: int = 32  # streaming steps per timed repeat
    repeats: int = 5  # timed repeats (median; streaming: interleaved rounds)
    threads: int | None = None  # torch threads (None: torch's default)
    device: str = "cpu"  # where the models run and are timed

    def __post_init__(self) -> None:
        require_choice("--device", self.device, DEVICES)
        require_choices("--benchmark", self.benchmark, BENCHMARKS)
        for field in fields(self):
            if field.name not in _NOT_INTEGERS:
                _at_least(self.option(field.name), getattr(self, field.name), _MINIMUM.get(field.name, 1))
        if not self.context or not self.attention or not self.stream_window or not self.stream_layers:
            empty = next(n for n in ("context", "attention", "stream_window", "stream_layers")
                         if not getattr(self, n))
            raise ValueError(f"{self.option(empty)}: must not be empty")
        if self.d_model % self.num_heads:
            raise ValueError(f"--d-model: must be divisible by --num-heads={self.num_heads}; got {self.d_model}")
        for kv in self.kv_heads:
            if self.num_heads % kv:
                raise ValueError(f"--num-kv-heads: must divide --num-heads={self.num_heads} (each key head "
                                 f"serves num_heads / num_kv_heads query heads); got {kv}")

    @classmethod
    def from_given(cls, **given: Any) -> DecodingOptions:
        """Options from the CLI: ``None`` takes the default; lists become tuples."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None})

    @staticmethod
    def option(name: str) -> str:
        return "--" + name.replace("_", "-")

    @property
    def sizes(self) -> dict[str, int]:
        return dict(d_model=self.d_model, num_heads=self.num_heads, num_layers=self.num_layers,
                    d_ff=self.d_ff, vocab_size=self.vocab_size)

    @property
    def kv_heads(self) -> tuple[int, ...]:
        return (self.num_heads,) if not self.num_kv_heads else tuple(self.num_kv_heads)

    @property
    def max_len(self) -> int:
        return max(self.context) + self.new_tokens
