"""What the conformance kit reports: one result per (check, parameter set, kernel)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check for one (params, kernel)."""

    check: str
    kernel: str
    params: dict[str, Any]
    status: str  # "pass" | "fail" | "skip"
    message: str = ""

    def __str__(self) -> str:
        head = f"[{self.status.upper()}] {self.check} kernel={self.kernel} params={self.params}"
        return f"{head}: {self.message}" if self.message else head


@dataclass
class ConformanceReport:
    """All check results for one attention."""

    name: str
    results: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the checks ran, when it matters
    #: called with each result as it arrives (``attn-bench check`` prints a line per check)
    on_result: Callable[[CheckResult], None] | None = field(default=None, repr=False,
                                                            compare=False)

    def add(self, results: Iterable[CheckResult]) -> None:
        """Record ``results`` (and pass each to :attr:`on_result`)."""
        for result in results:
            self.results.append(result)
            if self.on_result is not None:
                self.on_result(result)

    @property
    def passed(self) -> bool:
        """True when no check failed (skips are allowed)."""
        return not any(r.status == "fail" for r in self.results)

    @property
    def failures(self) -> list[str]:
        """One line per failed check, saying what is wrong."""
        return [str(r) for r in self.results if r.status == "fail"]

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` listing every failure."""
        if not self.passed:
            raise AssertionError(
                f"{self.name} failed {len(self.failures)} conformance check(s):\n"
                + "\n".join(self.failures)
            )

    def __str__(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        lines = [
            f"conformance of {self.name!r}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped"
        ]
        lines += [f"note: {note}" for note in self.notes]
        lines += [str(r) for r in self.results if r.status != "pass"]
        return "\n".join(lines)
