"""Sweep configs are validated on load: each error names the key and the allowed values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from baseline_packages import baselines_registered

from bench.engine.config import ConfigError, list_config_presets, resolve_config_path, safe_name
from bench.pretrained.config import parse_pretrained
from bench.quality.grid_config import parse_grid
from bench.runner import load_run
from bench.speed.cases import expand_cases
from bench.speed.config import parse_config

BASE = {"name": "t", "seq_len": [128, 256], "variants": [{"name": "full"}]}


def _with(**changes):
    return {**BASE, **changes}


@pytest.mark.parametrize(("raw", "fragment"), [
    (_with(seq_lens=[1]), "config key 'seq_lens': unknown key; allowed keys are"),
    (_with(variants=[{"name": "fulll"}]), "'variants[0].name': unknown variant 'fulll'"),
    (_with(variants=[{"name": "sliding_window", "windw": 3}]),
     "'variants[0].windw': unknown parameter for 'sliding_window'; allowed keys are"),
    (_with(variants=[{"name": "sliding_window", "window": -1}]), "'variants[0]'"),
    (_with(variants=[{"name": "relative", "bias": "sinusoid"}]), "'learned'"),
    (_with(passes=["fwd", "backward"]), "'passes': unknown value 'backward'; allowed values"),
    (_with(dtype="fp32"), "'dtype': unknown value 'fp32'"),
    (_with(device="tpu"), "'device': unknown value 'tpu'"),
    (_with(kernels=["fast"]), "'kernels': unknown value 'fast'"),
    (_with(seq_len=[0]), "'seq_len': must be an integer >= 1"),
    (_with(repeats="many"), "'repeats': must be an integer >= 1"),
    (_with(causal="yes"), "'causal': must be true or false"),
    (_with(fit_ranges=[[4096]]), "'fit_ranges': each range must be [lo, hi]"),
    (_with(fit_ranges=[[8192, 4096]]), "'fit_ranges': each range must be [lo, hi] with integers 1 <= lo < hi"),
    (_with(fit_ranges="4096:32768"), "'fit_ranges': must be a list of [lo, hi]"),
    (_with(plugins="bench.engine.testing"), "'plugins': must be a list of importable module names"),
    ({"seq_len": [1], "variants": [{"name": "full"}]}, "'name': is required"),
    (["not", "a", "mapping"], "must be a YAML mapping"),
])
def test_invalid_configs_name_the_key(raw, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert fragment in str(err.value)


def test_a_plugin_that_cannot_be_imported_is_named_when_the_run_loads():
    with pytest.raises(ConfigError, match="'plugins': cannot import module 'no_such_module_xyz'"):
        load_run(_with(plugins=["no_such_module_xyz"]))


def test_the_documented_form_loads_and_expands():
    config = parse_config({
        "name": "quick", "device": "cpu", "dtype": "float32",
        "passes": ["fwd", "bwd", "fwd_bwd"], "batch": 1, "heads": 8, "head_dim": 64,
        "seq_len": [256, 512], "repeats": 5, "kernels": ["auto", "reference", "native"],
        "variants": [{"name": "full"}, {"name": "sliding_window", "window": 128},
                     {"name": "nystrom", "num_landmarks": 64, "seq_len": [1024]},
                     {"name": "causal", "causal": True}],
    })
    cases = expand_cases(config)
    pairs = {(c.label, c.kernel) for c in cases}
    # only kernels a variant has become cases: nystrom has no reference kernel
    # labels name every pattern parameter, defaults included (pinv_iters=6)
    assert ("nystrom(num_landmarks=64, pinv_iters=6)", "reference") not in pairs
    assert ("nystrom(num_landmarks=64, pinv_iters=6)", "native") in pairs
    assert ("sliding_window(window=128)", "reference") in pairs
    assert [c.seq_len for c in cases if c.variant == "nystrom"] == [1024, 1024]
    assert all(c.causal for c in cases if c.variant == "causal")
    assert len({c.case_id for c in cases}) == len(cases)


def test_all_kernels_and_presets():
    config = parse_config(_with(kernels=["auto", "all"], variants=[{"name": "sliding_window"}]))
    kernels = {c.kernel for c in expand_cases(config)}
    assert {"auto", "reference", "sdpa"} <= kernels
    assert {"quick", "scaling-cpu", "scaling-gpu"} <= set(list_config_presets())
    with baselines_registered():  # baselines-cpu names the plug-in packages under examples/
        for preset in list_config_presets():
            _check_preset(preset)


def _check_preset(preset: str) -> None:
    """A preset loads by name to what its YAML parses to."""
    raw = yaml.safe_load(resolve_config_path(preset).read_text())
    loaded = load_run(preset)
    assert loaded.name == preset
    if raw.get("kind") == "quality":  # a training grid
        assert loaded == parse_grid(raw)
    elif raw.get("kind") == "pretrained":  # a pretrained-model run
        assert loaded == parse_pretrained(raw)
    else:
        assert loaded == parse_config(raw)


def test_quick_preset_covers_every_builtin_variant():
    quick = load_run("quick")
    builtins = {"full", "causal", "sliding_window", "dilated", "global_tokens", "nystrom",
                "relative"}
    assert {v.name for v in quick.variants} >= builtins and quick.device == "cpu"
    scaling = load_run("scaling-cpu")
    assert max(max(v.seq_len or scaling.seq_len) for v in scaling.variants) >= 65536
    assert set(scaling.passes) == {"fwd", "fwd_bwd"}
    gpu = load_run("scaling-gpu")
    assert gpu.dtype == "bfloat16" and max(gpu.seq_len) >= 131072


def test_case_id_is_stable_and_ignores_run_limits():
    a = expand_cases(parse_config(_with(repeats=3)))
    b = expand_cases(parse_config(_with(repeats=9, timeout_s=5)))
    assert [c.case_id for c in a] == [c.case_id for c in b]


@pytest.mark.parametrize(("text", "expected"), [
    ("../../etc/passwd", "etc_passwd"), ("quick", "quick"), ("a b/c", "a_b_c"), ("...", "run"),
])
def test_safe_name_stays_inside_out(text, expected):
    assert safe_name(text) == expected


def test_cli_overrides_replace_per_variant_lists():
    config = load_run("scaling-cpu")
    tiny = load_run("scaling-cpu", {"seq_len": (128, 256), "kernels": ("auto",)})
    cases = expand_cases(tiny)
    assert {c.seq_len for c in cases} == {128, 256}
    assert {c.kernel for c in cases} == {"auto"}
    assert len(cases) == 2 * len(config.variants)
    only = load_run("scaling-cpu", {"variants": ("nystrom",), "seq_len": (64,)})
    assert [(c.variant, c.seq_len) for c in expand_cases(only)] == [("nystrom", 64)]


# fp16 training: a model_step sweep's train_step would train float16 weights with no loss scaling,
# so it is refused in one line; the inference pass alone may still run in float16 (docs/gpu.md).
MODEL = {"d_model": 32, "num_heads": 2, "num_layers": 2, "d_ff": 64}


MODEL_STEP_BASE = {"name": "m", "workload": "model_step", "model": MODEL, "seq_len": [64],
        "variants": [{"name": "full"}]}


def test_float16_training_steps_are_refused_naming_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        parse_config({**MODEL_STEP_BASE, "dtype": "float16"})
    message = str(err.value)
    assert "\n" not in message
    assert "'dtype'" in message and "float32" in message and "bfloat16" in message
    assert "'float16'" not in message.split("allowed values are")[1]


def test_float16_inference_and_other_dtypes_still_parse():
    assert parse_config({**MODEL_STEP_BASE, "dtype": "float16", "passes": ["fwd"]}).dtype == "float16"
    assert parse_config({**MODEL_STEP_BASE, "dtype": "bfloat16"}).passes == ("fwd", "train_step")
    attention = {"name": "a", "seq_len": [64], "dtype": "float16", "variants": [{"name": "full"}]}
    assert parse_config(attention).dtype == "float16"  # attention sweeps: fwd_bwd is no training


# A plug-in is used from where its author wrote it: `--plugin path/to/file.py` (or a module in the
# current directory) works for every command that takes a variant, in the worker and kit processes
# too; a missing file or a plug-in that fails to import is one line naming --plugin and the value.
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
