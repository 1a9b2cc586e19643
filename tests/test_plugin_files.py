"""A plug-in is used from where its author wrote it: ``--plugin path/to/file.py`` (or a module
in the current directory) works for every command that takes a variant, with nothing on
``PYTHONPATH`` but the suite itself, in the worker and conformance processes too; a missing
file or a plug-in that fails to import is one line naming ``--plugin`` and the value."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
"""Full attention under a name of its own: a plug-in file outside any package."""
from attn import register_attention
from attn.variants.full import FullAttention


@register_attention("file_plugin_full")
class FilePluginFull(FullAttention):
    """Full attention (a plug-in written to a file)."""
'''


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``attn-bench ARGS`` run as a script (the current directory is not on ``sys.path``) in
    ``cwd``, with only the suite on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    script = "import sys; sys.path.remove(''); from bench.cli import main; sys.argv[0] = 'attn-bench'; main()"
    return subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def plugin_file(tmp_path: Path) -> Path:
    folder = tmp_path / "my plugins"  # a space: paths are not split
    folder.mkdir()
    path = folder / "my_block.py"
    path.write_text(textwrap.dedent(PLUGIN))
    return path


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_list_and_check_take_a_plugin_file(plugin_file: Path, elsewhere: Path) -> None:
    listed = _cli("list", "--plugin", str(plugin_file), cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert "file_plugin_full" in listed.stdout
    checked = _cli("check", "file_plugin_full", "--plugin", str(plugin_file), "--kernel",
                   "reference", "--timeout-s", "120", cwd=elsewhere)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "could not run in its process" not in checked.stdout + checked.stderr


@pytest.mark.slow  # 20 s; a plug-in file in the kit's processes stays in the default run
def test_a_sweep_and_its_workers_take_a_plugin_file(plugin_file: Path, elsewhere: Path) -> None:
    out = elsewhere / "run"
    done = _cli("sweep", "quick", "--variant", "file_plugin_full", "--seq-len", "64", "--pass",
                "fwd", "--repeats", "3", "--plugin", str(plugin_file), "--out", str(out),
                cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = (out / "results.csv").read_text()
    assert "file_plugin_full" in rows and ",ok," in rows, rows


@pytest.mark.slow  # 15 s (matplotlib in a fresh process)
def test_plot_patterns_takes_a_plugin_file(plugin_file: Path, elsewhere: Path) -> None:
    done = _cli("plot", "--patterns", "--out", str(elsewhere), "--plugin", str(plugin_file),
                cwd=elsewhere)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_module_in_the_current_directory_is_a_plugin(plugin_file: Path) -> None:
    listed = _cli("list", "--plugin", "my_block", cwd=plugin_file.parent)
    assert listed.returncode == 0, listed.stderr
    assert "file_plugin_full" in listed.stdout


@pytest.mark.parametrize("command", [["list"], ["check", "full"], ["plot", "--patterns"],
                                     ["report", "."], ["decoding"], ["train", "copy"],
                                     ["sweep", "quick", "--dry-run"]])
def test_a_missing_plugin_file_is_one_line_naming_the_option(command: list[str],
                                                             elsewhere: Path) -> None:
    from typer.testing import CliRunner

    from bench.cli import app

    result = CliRunner().invoke(app, [*command, "--plugin", "no/such/plug.py"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--plugin" in lines[0] and "plug.py" in lines[0], result.output


def test_a_plugin_file_that_fails_is_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bench.cli import app

    broken = tmp_path / "broken_plugin_file.py"
    broken.write_text("raise RuntimeError('boom')\n")
    result = CliRunner().invoke(app, ["list", "--plugin", str(broken)])
    assert result.exit_code == 2, result.output
    line, = result.output.strip().splitlines()
    assert "--plugin" in line and "broken_plugin_file.py" in line and "boom" in line
    assert "broken_plugin_file" not in sys.modules


def test_a_configs_plugins_take_a_relative_file_path(tmp_path: Path, monkeypatch) -> None:
    from attn.registry import unregister_attention
    from bench.runner import load_run

    folder = tmp_path / "plugs"
    folder.mkdir()
    (folder / "config_plugin_file.py").write_text(textwrap.dedent(PLUGIN).replace(
        '"file_plugin_full"', '"config_plugin_full"'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        config = load_run({"name": "p", "seq_len": [16], "plugins": ["plugs/config_plugin_file.py"],
                           "variants": [{"name": "config_plugin_full"}]})
        assert config.plugins == (str(folder / "config_plugin_file.py"),)  # workers start anywhere
    finally:
        unregister_attention("config_plugin_full")
        sys.modules.pop("config_plugin_file", None)
