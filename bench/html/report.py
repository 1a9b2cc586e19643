"""``report.html`` of a run directory of any kind, beside its markdown report."""

from __future__ import annotations

from pathlib import Path

from bench.decoding.results import is_decoding_run
from bench.html.decoding import decoding_sections
from bench.html.page import render_page, write_page
from bench.html.pretrained import pretrained_sections
from bench.html.provenance import run_provenance
from bench.html.quality import quality_sections
from bench.html.speed import speed_sections
from bench.pretrained.report import is_pretrained_run
from bench.quality.report import is_quality_run

PAGE_FILE = "report.html"


def run_kind(run_dir: str | Path) -> str:
    """``quality``, ``pretrained``, ``decoding`` or ``speed``: what wrote ``run_dir``."""
    if is_quality_run(run_dir):
        return "quality"
    if is_pretrained_run(run_dir):
        return "pretrained"
    return "decoding" if is_decoding_run(run_dir) else "speed"


def write_report_html(run_dir: str | Path) -> Path:
    """Write ``report.html`` into ``run_dir`` (a self-contained page); its path."""
    run_dir = Path(run_dir)
    kind = run_kind(run_dir)
    build = {"quality": quality_sections, "decoding": decoding_sections, "speed": speed_sections,
             "pretrained": pretrained_sections}[kind]
    sections, commits = build(run_dir)
    title = {"quality": "Quality report", "decoding": "Decoding report", "speed": "Benchmark report",
             "pretrained": "Pretrained-model report"}[kind]
    page = render_page(f"{title}: {run_dir.name}", run_provenance(run_dir, commits), sections)
    return write_page(run_dir / PAGE_FILE, page)
