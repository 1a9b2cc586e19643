"""The four registries (attentions, kernels, model kinds, quality tasks) follow one set of
rules, those of :class:`attn.table.Table`."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from attn import ExactAttention
from attn.kernels import BUILTIN_KERNELS, KERNELS, register_kernel, unregister_kernel
from attn.kernels.reference import ReferenceKernel
from attn.registration import REGISTRY, register_attention, unregister_attention
from attn.table import RegistrationError, Table
from bench.cli import app
from bench.quality.tasks import TASKS, ClassificationTask, register_task, unregister_task
from models import EncoderClassifier, EncoderClassifierConfig, register_model, unregister_model
from models.registration import MODELS


@dataclass(frozen=True)
class Domain:
    """One registry: its table, the name its register function's errors give the name, a
    class to register (``make(name, tag)``; a new definition per tag) and how to (un)register it."""

    table: Table[Any]
    arg: str
    make: Callable[[Any, str], type]
    register: Callable[[Any, type, bool], object]
    unregister: Callable[[str], None]


def subclass(base: type, tag: str, **attrs: Any) -> type:
    """A new class ``tag`` defined in this module."""
    return type(tag, (base,), {"__module__": __name__, **attrs})


DOMAINS = {
    "attention": Domain(REGISTRY, "name", lambda name, tag: subclass(ExactAttention, tag),
                        lambda name, cls, overwrite: register_attention(name, overwrite=overwrite)(cls),
                        unregister_attention),
    "kernel": Domain(KERNELS, "name", lambda name, tag: subclass(ReferenceKernel, tag, name=name),
                     lambda name, cls, overwrite: register_kernel(cls, overwrite=overwrite),
                     unregister_kernel),
    "model": Domain(MODELS, "kind",
                    lambda name, tag: subclass(EncoderClassifier, tag),
                    lambda name, cls, overwrite: register_model(name, EncoderClassifierConfig,
                                                                overwrite=overwrite)(cls),
                    unregister_model),
    "task": Domain(TASKS, "name", lambda name, tag: subclass(ClassificationTask, tag),
                   lambda name, cls, overwrite: register_task(name, presets={}, overwrite=overwrite)(cls),
                   unregister_task),
}


@pytest.fixture(params=list(DOMAINS))
def domain(request: pytest.FixtureRequest) -> Domain:
    return DOMAINS[request.param]


@pytest.mark.parametrize("bad", ["bad-name", "1st", "", 3])
def test_a_name_that_is_no_identifier_is_refused(domain: Domain, bad: Any) -> None:
    with pytest.raises(ValueError, match=rf"'{domain.arg}' must be an identifier string .*; got") as caught:
        domain.register(bad, domain.make(bad, "Bad"), False)
    assert isinstance(caught.value, RegistrationError)
    assert bad not in domain.table


def test_a_taken_name_is_replaced_only_with_overwrite(domain: Domain) -> None:
    first, second = domain.make("shared_rules", "First"), domain.make("shared_rules", "Second")
    domain.register("shared_rules", first, False)
    domain.register("shared_rules", first, False)  # the same definition again: no change
    with pytest.raises(ValueError, match=rf"{domain.arg} 'shared_rules' is already registered by "
                                         rf"{__name__}:First; pass overwrite=True"):
        domain.register("shared_rules", second, False)
    assert domain.table.sources["shared_rules"] == f"{__name__}:First"
    domain.register("shared_rules", second, True)
    assert domain.table.sources["shared_rules"] == f"{__name__}:Second"


def test_unregister_removes_the_name(domain: Domain) -> None:
    domain.register("shared_gone", domain.make("shared_gone", "Gone"), False)
    assert "shared_gone" in domain.table
    domain.unregister("shared_gone")
    assert "shared_gone" not in domain.table and "shared_gone" not in domain.table.sources
    domain.unregister("shared_gone")  # absent: no error


def test_builtin_sources_are_recorded() -> None:
    assert REGISTRY.sources["full"] == "attn.variants.full:FullAttention"
    assert KERNELS.sources["sdpa"] == "attn.kernels.sdpa:SdpaKernel" and len(KERNELS) >= len(BUILTIN_KERNELS)
    assert MODELS.sources["vit"] == "models.vit:ViT"
    assert TASKS.sources["listops"].startswith("bench.quality.tasks.listops:")


def test_a_kernel_registration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="register_kernel: 'cls' must be a Kernel subclass; got 42"):
        register_kernel(42)  # type: ignore[arg-type]


# A kernel, a task and a model kind are added without touching the suite: one plug-in module registers
# a toy kernel, a toy task (its tiny preset, metric title and table by condition) and a toy model kind;
# `attn-bench list`, a speed sweep, `attn-bench train` and a grid's quality report see them.
MODULE = "attn_bench_toy_plugin"


PLUGIN = '''
from dataclasses import dataclass

import numpy as np

from attn import register_kernel
from attn.kernels.reference import ReferenceKernel
from bench.quality.tasks import ClassificationTask, ConditionView, Metric, register_task
from bench.quality.tasks.base import DataSettings, as_tensors
from models import EncoderClassifier, EncoderClassifierConfig, Placement, register_model


@register_kernel
class ToyDenseKernel(ReferenceKernel):
    """The reference kernel's dense math under a name of its own."""

    name = "toy_dense"
    description = "dense softmax (a plug-in kernel)"


@dataclass(frozen=True)
class ToyConfig(EncoderClassifierConfig):
    """The toy kind's config: an encoder classifier's."""


def place_toy(variant, params, label, *, causal, mixer):
    """The variant is every block's self-attention, described the toy's way."""
    return Placement({"attention": variant, "attention_params": params}, f"toy mixer={label}")


@register_model("toy_encoder", ToyConfig, place=place_toy)
class ToyEncoder(EncoderClassifier):
    """An encoder classifier under its own kind."""


@register_task(
    "toy_first",
    presets={"tiny": {"data": {"seq_len": 16, "examples": 96}, "train": {"steps": 4}}},
    metric_title="toy accuracy",
    conditions=(ConditionView("accuracy", "half=", "Toy accuracy by half (test)"),),
)
class ToyFirst(ClassificationTask):
    """Is the first token a 2? Read by the toy model kind."""

    @dataclass(frozen=True)
    class Data(DataSettings):
        seq_len: int = 16
        examples: int = 96

    model_kind = "toy_encoder"
    num_classes = 2
    vocab_size = 4

    def prepare(self):
        n, length = self.data.examples, self.data.seq_len
        ids = np.random.default_rng(0).integers(1, 3, size=(n, length))
        arrays = {"ids": ids, "labels": (ids[:, 0] == 2).astype(np.int64)}
        third = n // 3
        self.splits = {"train": as_tensors(arrays, np.arange(third, n)),
                       "val": as_tensors(arrays, np.arange(0, third // 2)),
                       "test": as_tensors(arrays, np.arange(third // 2, third))}

    def condition_metrics(self, split, preds, labels):
        half = len(labels) // 2
        return [Metric("accuracy", float((preds[s] == labels[s]).float().mean()), f"half={i}")
                for i, s in enumerate((slice(0, half), slice(half, None)), start=1)]
'''


runner = CliRunner()


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plug-in module, importable here and in every worker process."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    from attn.kernels import unregister_kernel
    from bench.quality.tasks import unregister_task
    from models import unregister_model

    unregister_kernel("toy_dense")
    unregister_task("toy_first")
    unregister_model("toy_encoder")
    sys.modules.pop(MODULE, None)


def test_list_shows_the_plugin_kernel_task_and_model_kind(plugin):
    without = runner.invoke(app, ["list"])  # before the plug-in is imported in this process
    assert without.exit_code == 0 and "toy_dense" not in without.output
    result = runner.invoke(app, ["list", "--plugin", plugin])
    assert result.exit_code == 0, result.output
    assert "toy_first" in result.output and "toy_encoder" in result.output
    assert "toy accuracy" in result.output  # its metric's title
    assert "toy_dense" in result.output  # the kernel, among the kernels and each variant's


@pytest.mark.slow  # 20-40 s: the full run (-m '') has it, the inner loop does not
def test_a_sweep_runs_the_plugin_kernel_on_a_builtin_variant(plugin, tmp_path):
    import pandas as pd

    out = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", "quick", "--plugin", plugin, "--variant", "sliding_window",
                                 "--kernel", "toy_dense", "--seq-len", "64", "--pass", "fwd",
                                 "--repeats", "3", "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) >= 1 and set(rows.status) == {"ok"}, rows[["status", "reason"]]
    assert set(rows.kernel) == {"toy_dense"} and (rows.time_ms > 0).all()


def test_train_runs_the_plugin_task_on_the_plugin_model_kind(plugin, tmp_path):
    out = tmp_path / "train"
    result = runner.invoke(app, ["train", "toy_first", "--preset", "tiny", "--plugin", plugin,
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "test  accuracy:" in result.output and "[half=2]" in result.output
    rows = json.loads((out / "metrics.json").read_text())
    assert {r["model_kind"] for r in rows} == {"toy_encoder"}
    assert {r["attention_parts"] for r in rows} == {"toy mixer=full"}
    assert rows[0]["steps"] == 4  # the task's own tiny settings, no preset file edited
    elsewhere = runner.invoke(app, ["train", "toy_first", "--preset", "small", "--plugin", plugin,
                                    "--out", str(tmp_path / "small")])
    assert elsewhere.exit_code == 2 and "unknown task 'toy_first' in preset 'small'" in elsewhere.output


def test_the_quality_report_of_a_grid_run_shows_them(plugin, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "name": "toy", "kind": "quality", "preset": "tiny", "tasks": ["toy_first"],
        "variants": ["full", "sliding_window"], "seeds": [0], "plugins": [plugin],
        "timeout_s": 300}))
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(grid), "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    report = runner.invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    text = (out / "report.md").read_text()
    assert "| variant | toy_first | avg (accuracy tasks) |" in text
    assert "Headline metric per task: toy_first: toy accuracy." in text
    assert "## Toy accuracy by half (test)" in text and "half=2" in text
    assert "toy mixer=sliding_window(window=4)" in text  # which attention ran where
