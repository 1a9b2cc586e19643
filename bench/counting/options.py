"""The options of ``attn-bench count``, shared by the CLI and :func:`bench.counting.run.run_count` (no torch: the
CLI reads them at start-up)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attn.validation import require_choice, require_int

#: the dtypes a counted call may run in
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class CountOptions:
    """One variant and kernel, counted at each of ``seq_len`` on the CPU, one thread."""

    variant: str
    params: dict[str, Any] = field(default_factory=dict)  # the variant's parameters
    kernel: str = "auto"
    seq_len: tuple[int, ...] = (256, 512, 1024)
    batch: int = 1
    heads: int = 2
    head_dim: int = 32
    dtype: str = "float32"
    causal: bool = False
    calls: int = 5  # counted calls per length (and empty calls for the harness)
    warmup: int = 2  # uncounted calls first (allocator, kernel choice, cached masks)
    timeout_s: float = 3600.0  # the whole counted process

    def __post_init__(self) -> None:
        require_choice("--dtype", self.dtype, DTYPES)
        if not self.seq_len:
            raise ValueError("--seq-len: must not be empty")
        for length in self.seq_len:
            require_int("--seq-len", length, minimum=1)
        for name in ("batch", "heads", "head_dim", "calls"):
            require_int("--" + name.replace("_", "-"), getattr(self, name), minimum=1)
        require_int("--warmup", self.warmup, minimum=0)
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s: must be a number > 0; got {self.timeout_s!r}")

    def probe_spec(self) -> dict[str, Any]:
        """What the counted process needs, as JSON-ready values."""
        return {
            "variant": self.variant, "params": self.params, "kernel": self.kernel,
            "seq_len": list(self.seq_len), "batch": self.batch, "heads": self.heads,
            "head_dim": self.head_dim, "dtype": self.dtype, "causal": self.causal,
            "calls": self.calls, "warmup": self.warmup,
        }
