"""The one dialect of argument checks of attn, models and bench (docs/layout.md, "Argument checks"): each check
returns the accepted value or raises ``error("SUBJECT: must be ...; got VALUE")`` (``ValueError`` by default)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ErrorFactory = Callable[[str], Exception]


def invalid(subject: str, problem: str, error: ErrorFactory = ValueError) -> Exception:
    """The error for ``subject`` with ``problem`` (raise it): ``"SUBJECT: PROBLEM"``."""
    return error(f"{subject}: {problem}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's too


def require_int(subject: str, value: Any, *, minimum: int, error: ErrorFactory = ValueError) -> int:
    """``value`` if it is an integer >= ``minimum`` (bools are not integers)."""
    if not _is_int(value) or value < minimum:
        raise invalid(subject, f"must be an integer >= {minimum}; got {value!r}", error)
    return value


def require_optional_int(
    subject: str, value: Any, *, minimum: int, error: ErrorFactory = ValueError
) -> int | None:
    """Like :func:`require_int`, and ``None`` is allowed."""
    if value is not None and (not _is_int(value) or value < minimum):
        raise invalid(subject, f"must be None or an integer >= {minimum}; got {value!r}", error)
    return value


def require_number(
    subject: str, value: Any, *, minimum: float, integer: bool = False, error: ErrorFactory = ValueError
) -> Any:
    """``value`` if it is a number (an integer when ``integer``) >= ``minimum``."""
    ok = _is_int(value) if integer else isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or value < minimum:
        kind = "an integer" if integer else "a number"
        raise invalid(subject, f"must be {kind} >= {minimum}; got {value!r}", error)
    return value


def require_bool(subject: str, value: Any, *, error: ErrorFactory = ValueError) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise invalid(subject, f"must be true or false; got {value!r}", error)
    return value


def require_choice(subject: str, value: Any, allowed: Iterable[Any], *, error: ErrorFactory = ValueError) -> Any:
    """``value`` if it is one of ``allowed``; else the error lists them."""
    allowed = list(allowed)
    if value not in allowed:
        raise invalid(subject, f"unknown value {value!r}; allowed values are {allowed}", error)
    return value


def as_list(value: Any) -> list[Any]:
    """One value or a list/tuple of them, as a list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def require_choices(
    subject: str, value: Any, allowed: Iterable[Any], *, error: ErrorFactory = ValueError
) -> tuple[Any, ...]:
    """One of ``allowed`` or a non-empty list of them, as a tuple."""
    allowed = list(allowed)
    values = as_list(value)
    if not values:
        raise invalid(subject, f"must not be empty; allowed values are {allowed}", error)
    return tuple(require_choice(subject, v, allowed, error=error) for v in values)


def require_int_list(
    subject: str, value: Any, *, minimum: int = 1, error: ErrorFactory = ValueError
) -> tuple[int, ...]:
    """An integer >= ``minimum`` or a non-empty list of them, as a tuple."""
    values = as_list(value)
    if not values:
        raise invalid(subject, "must not be empty", error)
    for v in values:
        if not _is_int(v) or v < minimum:
            raise invalid(subject, f"must be an integer >= {minimum} or a list of them; got {v!r}", error)
    return tuple(values)


@dataclass(frozen=True)
class Param:
    """The rule of one constructor parameter: an integer >= ``minimum`` (``None`` allowed when
    ``optional``; odd only when ``odd``), or one of ``choices``."""

    minimum: int | None = None
    optional: bool = False
    odd: bool = False
    choices: tuple[Any, ...] | None = None

    def check(self, subject: str, value: Any, error: ErrorFactory = ValueError) -> Any:
        """``value`` if the rule allows it; else ``error`` naming ``subject``."""
        if self.choices is not None:
            return require_choice(subject, value, self.choices, error=error)
        if self.optional and value is None:
            return None
        if self.minimum is not None:
            check = require_optional_int if self.optional else require_int
            check(subject, value, minimum=self.minimum, error=error)
        if self.odd and value % 2 == 0:
            raise invalid(subject, f"must be odd; got {value!r}", error)
        return value
