"""Small points a user sees: files a run writes are readable by others as plots are (the
umask decides, not ``mkstemp``'s 0600); ``attn-bench check`` prints a line per check as it
goes; the sweep's progress bar shows its total (``2/2``, never ``1/?``)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.fsutil import atomic_write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_an_atomic_write_gets_the_mode_open_would_give(tmp_path: Path, umask: int,
                                                       mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "results.csv", "a,b\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "results.csv") == mode


@pytest.fixture
def sweep_out(tmp_path: Path):
    from bench.engine.testing import unregister_test_variants

    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
        "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
        "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}]}))
    old = os.umask(0o022)
    try:
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"),
                                          "--no-plots"])
    finally:
        os.umask(old)
        unregister_test_variants()
    assert result.exit_code == 0, result.output
    return tmp_path / "out", result.output


def test_the_progress_bar_shows_its_total(sweep_out) -> None:
    _, output = sweep_out
    assert "2/2" in output and "/?" not in output, output


def test_a_runs_files_are_readable_by_others(sweep_out) -> None:
    out, _ = sweep_out
    for name in ("results.csv", "env.json", "sweep.json"):
        assert _mode(out / name) == 0o644, name


def test_check_prints_a_line_per_check_as_it_goes() -> None:
    from attn.conformance import check_attention

    seen: list[str] = []
    started: list[str] = []
    report = check_attention("full", kernels=["reference"], quick=True,
                             on_result=lambda r: seen.append(str(r)),
                             on_start=lambda check, kernel, params: started.append(check))
    assert seen == [str(r) for r in report.results] and len(seen) > 3
    assert started == ["construct"] + [r.check for r in report.results]  # each before its result
    result = CliRunner().invoke(app, ["check", "full", "--kernel", "reference"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("quick profile: the first example parameter set"), lines[0]
    assert sum(line.startswith("[PASS]") for line in lines) > 3, result.output
    # a line as each check starts, then its result with its time
    at = lines.index("[ .. ] pattern kernel=reference params={}")
    assert re.fullmatch(r"\[PASS\] pattern kernel=reference params=\{\} \(\d+\.\d s\)", lines[at + 1])
    assert "alibi" not in result.output  # the quick profile: the first parameter set only


def test_check_full_runs_every_parameter_set() -> None:
    result = CliRunner().invoke(app, ["check", "full", "--kernel", "reference", "--full"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("full kit: every example parameter set and shape"), lines[0]
    assert "[PASS] matches_reference kernel=reference params={'position_bias': 'alibi'}" in result.output
    assert lines[-1].startswith("conformance of 'full'")
    assert lines[-1].startswith("conformance of 'full'")


def test_a_quality_checkpoint_is_readable_by_others_as_results_are(tmp_path: Path) -> None:
    import torch

    from bench.quality.checkpoint import load_checkpoint, save_checkpoint

    old = os.umask(0o022)
    try:
        save_checkpoint(tmp_path / "last.safetensors", {"w": torch.ones(2)}, {"step": 1})
    finally:
        os.umask(old)
    assert _mode(tmp_path / "last.safetensors") == 0o644
    tensors, meta = load_checkpoint(tmp_path / "last.safetensors")
    assert meta == {"step": 1} and tensors["w"].tolist() == [1.0, 1.0]


README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_bash_blocks() -> list[str]:
    import re

    return re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readmes_first_command_runs_the_sweep_once_and_nothing_after_it() -> None:
    first = _readme_bash_blocks()[0].strip()
    steps = [step.strip() for step in first.split("&&")]
    assert [s for s in steps if s.startswith("attn-bench")] == ["attn-bench sweep quick --out runs/quick"]
    assert steps[-1] == "attn-bench sweep quick --out runs/quick"  # its own last line says where


def test_a_sweep_ends_by_saying_where_its_results_are_on_lines_never_wrapped(tmp_path: Path) -> None:
    """Not a terminal (a pipe, CI's log): a long path stays on one line, and the last line
    names the report, the figures and the rows, which exist."""
    from bench.engine.testing import unregister_test_variants

    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
        "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"],
        "peak_matmul_size": 128, "variants": [{"name": "bench_sleep", "seconds": 0.01}]}))
    out = tmp_path / ("a-run-directory-whose-name-is-longer-than-a-terminal-line-" * 2)
    try:
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(out)])
    finally:
        unregister_test_variants()
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith(f"{out}: ok 2 rows this run") for line in lines), result.output
    last = lines[-1]
    for name in ("report.md", "report.html", "scaling.png", "results.csv"):
        assert str(out / name) in last, last
        assert (out / name).is_file()
    assert last.startswith(f"results: read {out / 'report.md'} first")


def test_the_readmes_last_path_example_is_what_the_code_records() -> None:
    import re

    import torch

    from attn import create_attention

    said = re.findall(r"# N=(\d+): (KernelPath\(.*?), \.\.\.\)", README.read_text())
    assert len(said) == 2, said
    for n, text in said:
        att = create_attention("sliding_window", window=128)
        q = torch.randn(1, 2, int(n), 16)
        att(q, q, q, causal=True, key_mask=torch.ones(1, int(n), dtype=torch.bool))
        assert repr(att.last_path).startswith(text + ", "), (n, repr(att.last_path))


def test_the_report_explains_peak_fraction_and_mask_emulated(sweep_out) -> None:
    from bench.speed.report import build_report

    out, _ = sweep_out
    text = build_report(out)
    assert "peak_fraction_at_max_n" in text and "mask_emulated" in text  # the columns explained
    legend = next(line for line in text.splitlines() if line.startswith("Columns: "))
    assert "`peak_fraction_at_max_n` is" in legend and "matmul" in legend
    assert "`mask_emulated` is True when" in legend and "N x N" in legend
    assert text.index(legend) < text.index("## Scaling")
