"""One self-contained HTML page that opens offline; nothing a row carries may run or fetch (docs/reliability.md)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from bench.engine.fsutil import atomic_write_text
from bench.engine.markdown import cell

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
table.sortable th { cursor: pointer; background: #f0f0f0; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
tr.failed { background: #f8d0d0; } tr.noisy { background: #fff0c0; } tr.regression { background: #f8d0d0; }
td.mark { font-weight: bold; } .filters { margin: 0.5em 0; } .filters label { margin-right: 1em; }
dl.provenance { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dl.provenance dt { font-weight: bold; } .note { color: #555; max-width: 60em; }
"""


def _script(name: str) -> str:
    return resources.files("bench.html").joinpath(name).read_text(encoding="utf-8")


#: the trace types of Plotly's partial "basic" bundle (npm ``plotly.js-basic-dist-min``)
BASIC_TRACES = frozenset({"bar", "pie", "scatter"})
#: that bundle, gzip-compressed, as shipped in this package (``vendor/README.md``)
BASIC_BUNDLE = "vendor/plotly-basic.min.js.gz"


def trace_types(fig: go.Figure | dict) -> set[str]:
    traces = (fig.get("data") or []) if isinstance(fig, dict) else fig.data
    return {(trace.get("type") if isinstance(trace, dict) else trace.type) or "scatter" for trace in traces}


def packed_plotly(types: Iterable[str] = ("scatter",)) -> str:
    """The Plotly bundle drawing ``types``, gzipped, base64: the "basic" one where it can, else the full one."""
    if set(types) <= BASIC_TRACES:
        packed = resources.files("bench.html").joinpath(BASIC_BUNDLE).read_bytes()
    else:
        packed = gzip.compress(get_plotlyjs().encode("utf-8"), mtime=0)
    return base64.b64encode(packed).decode("ascii")


#: figure keys whose strings are the page's own Plotly templates (constants, never data)
TEMPLATE_KEYS = frozenset({"hovertemplate", "texttemplate"})
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_-]")


def safe_id(text: str) -> str:
    """An element id of ``[A-Za-z0-9_-]`` only; other text gets a short hash appended (ids stay distinct)."""
    slug = _UNSAFE_ID.sub("-", text)
    return slug if slug == text and slug else f"{slug[:40]}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


def safe_link(link: str) -> str | None:
    """``link`` as a relative path, each segment percent-encoded (no ``javascript:``); None if empty or absolute."""
    parts = str(link).replace("\\", "/").split("/")
    return "/".join(quote(part, safe="") for part in parts) if link and parts[0] else None


def plain_text(value: Any, key: str = "") -> Any:
    """A figure's JSON with every string's markup escaped (Plotly renders it), but the page's own templates."""
    if isinstance(value, str):
        return value if key in TEMPLATE_KEYS else html.escape(value, quote=False)
    if isinstance(value, dict):
        return {k: plain_text(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_text(v, key) for v in value]
    return value


def figure_div(fig: go.Figure | dict, div_id: str, *, links: bool = False) -> str:
    """``fig`` as a ``<div>`` and its JSON for ``plots.js``; ``links``: a click opens a point's last ``customdata``."""
    plain = plain_text(json.loads(pio.to_json(fig, validate=False)))
    data = json.dumps(plain, separators=(",", ":")).replace("</", "<\\/")  # no "</script>" inside
    div_id = safe_id(div_id)
    flag = ' data-links="1"' if links else ""
    flag += f' data-traces="{" ".join(sorted(trace_types(fig)))}"'
    return (f'<div class="plot" id="{div_id}"{flag}></div>'
            f'<script type="application/json" id="{div_id}-data">{data}</script>')


def _sort_key(value: Any) -> str:
    """A number's full value, so ``-`` and rounding do not reorder."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(float(value))
    return ""


def table_html(df: pd.DataFrame, table_id: str, *, filters: Mapping[str, str] | None = None,
               marks: Sequence[str] | None = None, links: Mapping[str, str] | None = None) -> str:
    """``df`` as a sortable table: ``filters`` ``{name: column}``, ``marks`` a word a row, ``links`` ``{col: col}``."""
    table_id = safe_id(table_id)
    filters = dict(filters or {})
    links = dict(links or {})
    marks = list(marks) if marks is not None else None
    shown = [c for c in df.columns if c not in links.values()]
    parts = []
    if filters:
        parts.append('<div class="filters">')
        for name, column in filters.items():
            values = sorted({str(v) for v in df[column]})
            options = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
            parts.append(f'<label>{html.escape(name)} <select data-table="{table_id}" data-filter="{name}">'
                         f'<option value="">(all)</option>{options}</select></label>')
        parts.append("</div>")
    head = (["<th>mark</th>"] if marks is not None else []) + [f"<th>{html.escape(str(c))}</th>" for c in shown]
    parts.append(f'<table class="sortable" id="{table_id}"><thead><tr>{"".join(head)}</tr></thead><tbody>')
    for i, row in enumerate(df.itertuples(index=False)):
        values = dict(zip(df.columns, row))
        attrs = "".join(f' data-{name}="{html.escape(str(values[column]))}"' for name, column in filters.items())
        cells = []
        if marks is not None:
            attrs += f' class="{marks[i]}"' if marks[i] else ""
            cells.append(f'<td class="mark">{html.escape(marks[i])}</td>')
        for column in shown:
            value = values[column]
            text = html.escape(cell(value.item() if hasattr(value, "item") else value))
            href = safe_link(str(values[links[column]])) if column in links and values[links[column]] else None
            if href:
                text = f'<a href="{html.escape(href)}">{text}</a>'
            key = _sort_key(value)
            cells.append(f'<td data-sort="{key}">{text}</td>' if key else f"<td>{text}</td>")
        parts.append(f"<tr{attrs}>{''.join(cells)}</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def provenance_html(items: Mapping[str, str]) -> str:
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items.items())
    return f'<dl class="provenance" id="provenance">{rows}</dl>'


def section(title: str, *blocks: str, note: str = "") -> str:
    intro = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return f"<section><h2>{html.escape(title)}</h2>{intro}{''.join(blocks)}</section>"


def script_hash(code: str) -> str:
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def content_security_policy(scripts: Sequence[str]) -> str:
    """No network; the inline ``scripts`` by hash (and what they load); styles inline; ``data:`` images and fonts."""
    allowed = " ".join(script_hash(code) for code in scripts)
    return (f"default-src 'none'; script-src {allowed} 'strict-dynamic'; style-src 'unsafe-inline'; "
            "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")


def render_page(title: str, provenance: Mapping[str, str], sections: Sequence[str]) -> str:
    """The whole document: ``title``, provenance, ``sections``, Plotly, scripts and styles inline, under a CSP."""
    types = {kind for found in re.findall(r'<div class="plot"[^>]* data-traces="([^"]*)"', "".join(sections))
             for kind in found.split()}
    scripts = [_script("plots.js"), _script("table.js")]
    policy = html.escape(content_security_policy(scripts))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">',
        f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>", provenance_html(provenance), *sections,
        f'<script type="application/octet-stream" id="plotly-gz">{packed_plotly(types)}</script>',
        *(f"<script>{code}</script>" for code in scripts),
        "</body></html>"])


def write_page(path: str | Path, text: str) -> Path:
    path = Path(path)
    atomic_write_text(path, text)
    return path
