"""One self-contained HTML page (Plotly, scripts, styles and data inline): it opens offline and no request
leaves it. Nothing a row, label or folder name carries may run or fetch anything (docs/reliability.md, "Pages").
"""

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
    """The Plotly bundle that draws ``types``, gzipped and base64-encoded: the "basic" bundle where it has
    every type (0.39 MB packed), else the installed full one (1.9 MB packed; docs/history.md)."""
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
    if slug == text and slug:
        return slug
    return f"{slug[:40]}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


def safe_link(link: str) -> str | None:
    """``link`` as a relative path, every segment percent-encoded (no ``javascript:`` survives); None for an
    empty or absolute path."""
    parts = str(link).replace("\\", "/").split("/")
    if not link or not parts[0]:
        return None
    return "/".join(quote(part, safe="") for part in parts)


def plain_text(value: Any, key: str = "") -> Any:
    """A figure's JSON with every string's markup escaped (Plotly renders ``<a href>`` and others in text),
    except the page's own templates (:data:`TEMPLATE_KEYS`)."""
    if isinstance(value, str):
        return value if key in TEMPLATE_KEYS else html.escape(value, quote=False)
    if isinstance(value, dict):
        return {k: plain_text(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_text(v, key) for v in value]
    return value


def figure_div(fig: go.Figure | dict, div_id: str, *, links: bool = False) -> str:
    """``fig`` (a figure or its JSON dict) as a ``<div class="plot">`` plus its escaped JSON, drawn by ``plots.js``;
    ``links``: a click opens the link in the last field of a point's ``customdata`` (:func:`safe_link`)."""
    plain = plain_text(json.loads(pio.to_json(fig, validate=False)))
    data = json.dumps(plain, separators=(",", ":")).replace("</", "<\\/")  # no "</script>" inside
    div_id = safe_id(div_id)
    flag = ' data-links="1"' if links else ""
    flag += f' data-traces="{" ".join(sorted(trace_types(fig)))}"'
    return (f'<div class="plot" id="{div_id}"{flag}></div>'
            f'<script type="application/json" id="{div_id}-data">{data}</script>')


def _text(value: Any) -> str:
    return cell(value.item() if hasattr(value, "item") else value)


def _sort_key(value: Any) -> str:
    """A number's full value, so ``-`` and rounding do not reorder."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(float(value))
    return ""


def table_html(df: pd.DataFrame, table_id: str, *, filters: Mapping[str, str] | None = None,
               marks: Sequence[str] | None = None, links: Mapping[str, str] | None = None) -> str:
    """``df`` as a sortable table. ``filters``: ``{name: column}``, one ``<select>`` each; ``marks``: one word per
    row (``failed``, ``noisy``, ``regression`` or ``""``), its class and a first column; ``links``: ``{column:
    link column}``, the cell a link to the other column's value."""
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
            text = html.escape(_text(value))
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
    """No network; the inline ``scripts`` by hash (``'strict-dynamic'``: what they load, Plotly's unpacked
    bundle); styles inline; images and fonts from ``data:``; no forms, no ``<base>``."""
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
