"""Series styles for a page's figures: 48 colours, then another marker symbol per round of them; grey guides."""

from __future__ import annotations

from plotly.colors import qualitative

COLOURS: tuple[str, ...] = (*qualitative.Dark24, *qualitative.Light24)
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "hexagon")
GREY = "#8c8c8c"


def series_styles(count: int) -> list[tuple[str, str]]:
    """``(colour, marker symbol)`` of ``count`` series: every colour once before a symbol changes."""
    return [(COLOURS[i % len(COLOURS)], SYMBOLS[(i // len(COLOURS)) % len(SYMBOLS)]) for i in range(count)]
