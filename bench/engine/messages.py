"""Values and messages cut to a readable length, so that no error echoes a huge input whole.

A config value of ten million characters, or a list of a million items, would otherwise be
printed whole by the message that refuses it. :func:`shown` is the ``repr`` of a value with
long strings and containers cut, saying how long the string was; :func:`cut` shortens a
finished message. Imports nothing heavy (the CLI uses it before torch is loaded).
"""

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
    """``repr(value)`` of at most about ``limit`` characters: a longer string is cut and its
    length said (``'yyyy...' ... (10,485,760 characters)``), a long or deep container keeps
    its first items (``[1, 2, ...]``)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    text = _repr(limit).repr(value)
    return cut(text, limit * 2)


def cut(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"
