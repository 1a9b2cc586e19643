"""What one training run is (:class:`RunSpec`), shared by the trainer and the run that builds it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    """What to train: task, variant and its explicit parameters, preset, seed, where."""

    task: str
    variant: str
    preset: str
    seed: int
    out: str
    params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    threads: int | None = None
    kernel: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # settings overrides (tests, sweeps)
    plugins: tuple[str, ...] = ()  # modules imported first (they register attentions)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
