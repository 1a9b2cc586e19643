"""README.md as written: its first command runs the sweep once and nothing after it, and its
``last_path`` example is what the code records."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_bash_blocks() -> list[str]:
    import re

    return re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readmes_first_command_runs_the_sweep_once_and_nothing_after_it() -> None:
    first = _readme_bash_blocks()[0].strip()
    steps = [step.strip() for step in first.split("&&")]
    assert [s for s in steps if s.startswith("attn-bench")] == ["attn-bench sweep quick --out runs/quick"]
    assert steps[-1] == "attn-bench sweep quick --out runs/quick"  # its own last line says where


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
