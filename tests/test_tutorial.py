"""docs/tutorial.md runs as written: every ```bash block, in order, in an empty folder, exits
0, and every file under ``runs/`` (or ``.py`` file) the text names in backquotes exists
afterwards. Only the install block (``pip install``) is skipped: the suite under test is
already importable, and ``attn-bench`` runs this checkout's code (a shim on ``PATH``)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"


def bash_blocks(text: str) -> list[str]:
    """The ```bash blocks of ``text``, in order."""
    return re.findall(r"^```bash\n(.*?)^```$", text, flags=re.S | re.M)


def named_files(text: str) -> set[str]:
    """The files the text promises: backquoted paths under ``runs/`` and ``.py`` files in
    the working folder (``runs/first/report.md``, ``block_local.py``)."""
    return {p for p in re.findall(r"`([\w./-]+)`", text)
            if (p.startswith("runs/") and Path(p).suffix) or re.fullmatch(r"\w+\.py", p)}


def attn_bench_shim(bin_dir: Path) -> dict[str, str]:
    """An environment whose ``attn-bench`` is ``python -m bench.cli`` of this checkout."""
    bin_dir.mkdir()
    shim = bin_dir / "attn-bench"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bench.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_the_tutorial_is_parsed_as_intended() -> None:
    text = TUTORIAL.read_text()
    blocks = bash_blocks(text)
    assert sum("pip install" in b for b in blocks) == 1 and "pip install" in blocks[0]
    commands = "\n".join(blocks)
    for step in ("attn-bench sweep quick", "attn-bench check block_local --plugin block_local.py",
                 "--variant block_local --variant full", "attn-bench train recall --variant block_local"):
        assert step in commands, step
    assert {"runs/first/report.md", "runs/first/scaling.png", "block_local.py",
            "runs/mine/report.md", "runs/recall-block_local/metrics.json"} <= named_files(text)
    assert "docs/tutorial.md" in (ROOT / "README.md").read_text()  # the README links it


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_command_of_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    text = TUTORIAL.read_text()
    work = tmp_path / "work"
    work.mkdir()
    env = attn_bench_shim(tmp_path / "bin")
    took, outputs = [], {}
    for block in bash_blocks(text):
        if "pip install" in block:  # the install: this checkout is what runs
            continue
        start = time.monotonic()
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        took.append(f"{time.monotonic() - start:.0f} s: {block.splitlines()[0]}")
        assert done.returncode == 0, f"{block}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        outputs[block.splitlines()[0]] = done.stdout + done.stderr
        if block.startswith("attn-bench sweep"):  # its last line says where the results are
            assert done.stderr.strip().splitlines()[-1].startswith("results: read runs/"), done.stderr
    missing = sorted(p for p in named_files(text) if not (work / p).is_file())
    assert not missing, (missing, took)
    said = "\n".join(outputs.values())
    assert "conformance of 'block_local': " in said and " 0 failed" in said, said
    assert "block_local:" in said and "params:  block_size=64" in said  # attn-bench list
    print("\n".join(took))
