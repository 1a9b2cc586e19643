"""A small config cannot take all memory: the YAML's size, what its aliases expand to, one
string's length and the nesting depth are bounded before anything is expanded, and error
messages cut long values (``... (10,485,760 characters)``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.engine.bounded_yaml import YamlLimitError, YamlLimits, load_bounded
from bench.engine.config import ConfigError, load_yaml
from bench.engine.messages import shown
from bench.runner import load_run

ROOT = Path(__file__).resolve().parents[1]
BASE = "name: bomb\nseq_len: [16]\nplugins: [bench.engine.testing]\n"


def _bomb() -> str:
    """Nine levels of nine aliases, as one flow list: a few hundred bytes standing for 387
    million strings."""
    levels = ['&a0 ["' + "x" * 50 + '"]']
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "[" + ", ".join(levels) + "]"


BOMBS = {
    "description": BASE + "variants: [{name: bench_sleep}]\ndescription: " + _bomb() + "\n",
    "plugins": "name: bomb\nseq_len: [16]\nvariants: [{name: bench_sleep}]\nplugins: " + _bomb() + "\n",
    "variant parameter": BASE + "variants: [{name: bench_sleep, seconds: " + _bomb() + "}]\n",
}


@pytest.mark.parametrize("where", list(BOMBS))
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path, where):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS[where])
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"once its aliases \(\*name\) are expanded"):
        load_yaml(path)  # refused as read: nothing after it ever walks the value
    assert time.monotonic() - start < 5


def test_an_alias_bomb_ends_a_dry_run_in_one_line_within_bounded_memory(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS["description"])
    limit = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
             "sys.argv = ['attn-bench', 'sweep', sys.argv[1], '--dry-run']; "
             "runpy.run_module('bench.cli', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", limit, str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize(("text", "said"), [
    ("a: " + "y" * 20_000, "a value of 20,000 characters; at most 10,000"),
    ("a: " + "[" * 100 + "]" * 100, "nested more than 64 deep"),
    ("a: &r [*r]", "a recursive value"),
    ("a: " + "9" * 6000, "cannot read the YAML: ValueError"),
    ("a: [1, 2", "invalid YAML"),
])
def test_the_bounded_loader_says_which_limit_a_document_passes(text, said):
    with pytest.raises(YamlLimitError, match=said):
        load_bounded(text, "cfg.yaml")


def test_the_bounded_loader_reads_what_safe_load_reads():
    text = "a: &x {b: [1, 2.5, null, true, 'c']}\nd: *x\ne: 2026-01-01\n"
    assert load_bounded(text) == yaml.safe_load(text)
    assert load_bounded(f"a: [{', '.join(['1'] * 90)}]", limits=YamlLimits(max_nodes=100))


def test_a_config_over_the_size_limit_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(BASE + "variants: [{name: '" + "y" * 10_485_760 + "'}]\n")
    with pytest.raises(ConfigError) as err:
        load_run(path)
    size = path.stat().st_size
    assert str(err.value) == f"{path}: {size:,} bytes; a config may have at most 1,048,576"


def test_an_error_message_cuts_a_long_value(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(BASE + "variants: [{name: '" + "y" * 9_000 + "'}]\n")
    with pytest.raises(ConfigError) as err:
        load_run(path)
    message = str(err.value)
    assert "unknown variant 'yyyy" in message and "... (9,000 characters)" in message
    assert len(message) < 1500
    assert shown("z" * 10_485_760).endswith("... (10,485,760 characters)")
