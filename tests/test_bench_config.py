"""Sweep configs are validated on load: each error names the key and the allowed values."""

from __future__ import annotations

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
