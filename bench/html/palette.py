"""Series styles for a page's figures: a distinct colour for every series (48, Plotly's
Dark24 then Light24), then another marker symbol for each further round of the colours;
guides and references in grey."""

from __future__ import annotations

from plotly.colors import qualitative

COLOURS: tuple[str, ...] = (*qualitative.Dark24, *qualitative.Light24)
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "hexagon")
GREY = "#8c8c8c"


def series_styles(count: int) -> list[tuple[str, str]]:
    """``(colour, marker symbol)`` of ``count`` series: every colour once before a symbol
    changes, so series up to 48 differ by colour."""
    return [(COLOURS[i % len(COLOURS)], SYMBOLS[(i // len(COLOURS)) % len(SYMBOLS)]) for i in range(count)]
