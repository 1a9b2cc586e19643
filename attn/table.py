"""The one registry type of attentions, kernels, model kinds and tasks (docs/extending.md); it imports nothing
from attn, so models and bench use it too."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class RegistrationError(ValueError):
    """A name or object a registry refuses."""


def identifier_like(name: str) -> str:
    """A valid name close to ``name`` (for error messages)."""
    fixed = re.sub(r"\W", "_", name) or "my_name"
    return f"_{fixed}" if fixed[0].isdigit() else fixed


def source_of(obj: Any) -> str:
    """``module:qualname`` of a class or function, or of an instance's class."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{target.__qualname__}"


class Table(Mapping[str, T]):
    """Entries by name and where each came from; ``register`` and ``arg`` name the caller in errors."""

    def __init__(self, register: str, arg: str = "name") -> None:
        self.register, self.arg = register, arg
        self.entries: dict[str, T] = {}
        self.sources: dict[str, str] = {}

    def check_name(self, name: Any) -> str:
        """``name`` if it is an identifier string, else ``RegistrationError``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistrationError(
                f"{self.register}: {self.arg!r} must be an identifier string (letters, digits and "
                f"underscores, e.g. {identifier_like(str(name))!r}); got {name!r}")
        return name

    def add(self, name: str, value: T, *, source: str | None = None, overwrite: bool = False) -> T:
        """Register ``value`` as ``name``; a taken name needs ``overwrite=True`` unless it is the same
        object or definition (a module imported again)."""
        self.check_name(name)
        source = source or source_of(value)
        taken = self.sources.get(name, "?")
        same = self.entries.get(name) is value or (taken == source and "<lambda>" not in source)
        if name in self.entries and not (same or overwrite):
            raise RegistrationError(f"{self.register}: {self.arg} {name!r} is already registered by "
                                    f"{taken}; pass overwrite=True to replace it")
        self.entries[name], self.sources[name] = value, source
        return value

    def remove(self, name: str) -> None:
        """Unregister ``name``; no error if it is absent."""
        self.entries.pop(name, None)
        self.sources.pop(name, None)

    def snapshot(self) -> tuple[dict[str, T], dict[str, str]]:
        """A copy of the entries and sources, for :meth:`restore`."""
        return dict(self.entries), dict(self.sources)

    def restore(self, saved: tuple[dict[str, T], dict[str, str]]) -> None:
        """Put back the entries and sources of a :meth:`snapshot`."""
        for mine, theirs in zip((self.entries, self.sources), saved):
            mine.clear()
            mine.update(theirs)  # type: ignore[arg-type]

    def __getitem__(self, name: str) -> T:
        return self.entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
