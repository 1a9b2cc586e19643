"""The Plotly bundle a page inlines: Plotly's partial "basic" bundle shipped in the package
where it draws every figure of the page, the installed plotly's full bundle otherwise."""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import re
from importlib import resources

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from bench.html.page import BASIC_BUNDLE, figure_div, render_page, script_hash, trace_types

#: sha256 of the unpacked basic bundle, as bench/html/vendor/README.md records it
BASIC_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"


def inlined_bundle(page: str) -> str:
    """The JavaScript a page's script#plotly-gz carries, unpacked."""
    packed = re.search(r'<script type="application/octet-stream" id="plotly-gz">([^<]*)</script>', page)
    return gzip.decompress(base64.b64decode(packed.group(1))).decode("utf-8")


def test_the_shipped_basic_bundle_is_the_recorded_file():
    packed = resources.files("bench.html").joinpath(BASIC_BUNDLE).read_bytes()
    js = gzip.decompress(packed)
    assert hashlib.sha256(js).hexdigest() == BASIC_SHA256
    assert b"plotly.js (basic - minified)" in js[:200]
    readme = resources.files("bench.html").joinpath("vendor/README.md").read_text(encoding="utf-8")
    assert BASIC_SHA256 in readme


def test_trace_types_reads_figures_and_their_json():
    fig = go.Figure([go.Scatter(x=[1], y=[2]), go.Bar(x=[1], y=[2])])
    assert trace_types(fig) == {"scatter", "bar"}
    assert trace_types({"data": [{"x": [1]}, {"type": "heatmap", "z": [[1]]}]}) == {"scatter", "heatmap"}
    assert trace_types({"layout": {}}) == set()


def test_a_page_of_scatter_figures_inlines_the_basic_bundle():
    div = figure_div(go.Figure([go.Scatter(x=[1, 2], y=[3, 4], error_y={"array": [0.1, 0.2]})]), "speed")
    assert 'data-traces="scatter"' in div
    js = inlined_bundle(render_page("t", {}, [div]))
    assert hashlib.sha256(js.encode("utf-8")).hexdigest() == BASIC_SHA256


def test_a_page_with_a_trace_outside_the_basic_bundle_inlines_the_full_one():
    scatter = figure_div(go.Figure([go.Scatter(x=[1], y=[2])]), "a")
    heatmap = figure_div(go.Figure([go.Heatmap(z=[[1, 2], [3, 4]])]), "b")
    assert inlined_bundle(render_page("t", {}, [scatter, heatmap])) == get_plotlyjs()


def test_a_page_allows_only_its_own_inline_scripts_and_no_network():
    page = render_page("t", {"run": "x"}, [figure_div(go.Figure(go.Scatter(x=[1], y=[2])), "f")])
    policy = html.unescape(re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page).group(1))
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)  # the inline scripts that run
    assert len(scripts) == 2
    assert directives["script-src"].split() == [*(script_hash(code) for code in scripts), "'strict-dynamic'"]
    assert directives["default-src"] == "'none'" and directives["img-src"] == "data:"
    assert "unsafe" not in directives["script-src"] and "connect-src" not in directives  # default: none
