"""Values and messages cut to a readable length, so no error echoes a huge input whole; imports nothing heavy."""

from __future__ import annotations

import reprlib
from typing import Any

#: characters of a value kept in a message
VALUE_CHARS = 200
#: characters of a whole one-line message kept
MESSAGE_CHARS = 2000


def _repr(limit: int) -> reprlib.Repr:
    shortener = reprlib.Repr()
    shortener.maxstring = limit
    shortener.maxother = limit
    shortener.maxlist = shortener.maxtuple = shortener.maxdict = shortener.maxset = 10
    shortener.maxlevel = 3
    return shortener


def shown(value: Any, limit: int = VALUE_CHARS) -> str:
    """``repr(value)`` of about ``limit`` characters at most: a string cut with its length said, containers cut."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    return cut(_repr(limit).repr(value), limit * 2)


def cut(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
