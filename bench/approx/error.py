"""The error of approximate attentions against exact full attention by length and size parameter on seeded
``N(0, 1)`` inputs, beside the ``uniform (mean of v)`` baseline (``attn-bench approx-error``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import attn
from bench.engine.fsutil import atomic_write_text
from bench.engine.markdown import markdown_table
from bench.engine.provenance import environment
from bench.engine.results import write_env
from bench.engine.threads import torch_threads


@dataclass(frozen=True)
class SizeSweep:
    """One variant and the values of its size parameter (``param`` None: it has none)."""

    variant: str
    param: str | None = None
    sizes: tuple[int, ...] = ()

    def settings(self) -> list[dict[str, int]]:
        return [{self.param: s} for s in self.sizes] if self.param else [{}]


DEFAULT_SWEEPS = (
    SizeSweep("nystrom", "num_landmarks", (16, 64, 256)),
    SizeSweep("performer", "num_features", (16, 64, 256)),
    SizeSweep("linformer", "proj_len", (16, 64, 256)),
    SizeSweep("linear_attention"),
)
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass(frozen=True)
class ApproxOptions:
    sweeps: tuple[SizeSweep, ...] = DEFAULT_SWEEPS
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    batch: int = 1
    heads: int = 2
    head_dim: int = 32
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be an integer >= 1; got {value!r}")
        if not self.lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.lengths):
            raise ValueError(f"--length: must be integers >= 1; got {list(self.lengths)}")


def parse_sweep(spec: str) -> SizeSweep:
    """``NAME`` or ``NAME:PARAM=V1,V2,...`` -> a :class:`SizeSweep` (ValueError names ``--variant``)."""
    name, _, rest = spec.partition(":")
    if not rest:
        return SizeSweep(name)
    param, _, values = rest.partition("=")
    try:
        sizes = tuple(int(v) for v in values.split(","))
    except ValueError:
        sizes = ()
    if not param or not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--variant: expected NAME or NAME:PARAM=V1,V2,... with integers >= 1; got {spec!r}")
    return SizeSweep(name, param, sizes)


def check_sweeps(sweeps: tuple[SizeSweep, ...]) -> None:
    """``ValueError`` naming ``--variant`` for an unknown, exact or wrongly-parametrised variant."""
    approximate = [n for n in attn.list_attention() if not attn.attention_info(n).exact]
    for sweep in sweeps:
        if sweep.variant not in approximate:
            raise ValueError(f"--variant: {sweep.variant!r} is not a registered approximate attention; "
                             f"allowed values are {approximate}")
        params = attn.attention_info(sweep.variant).params
        if sweep.param is not None and sweep.param not in params:
            raise ValueError(f"--variant {sweep.variant}: unknown parameter {sweep.param!r}; "
                             f"allowed values are {sorted(params)}")


def seeded_inputs(options: ApproxOptions, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v (B, H, N, D)``, float32, N(0, 1), the same for every variant at this length."""
    gen = torch.Generator().manual_seed(options.seed * 1_000_003 + length)
    shape = (options.batch, options.heads, length, options.head_dim)
    return tuple(torch.randn(shape, generator=gen) for _ in range(3))  # type: ignore[return-value]


def error_rows(options: ApproxOptions, on_row=print) -> list[dict[str, Any]]:
    """One row per (variant, size, length): the errors against exact full attention."""
    rows = []
    for length in options.lengths:
        q, k, v = seeded_inputs(options, length)
        full = attn.create_attention("full", num_heads=options.heads, head_dim=options.head_dim)
        with torch.no_grad():
            exact = full(q, k, v).double()  # (B, H, N, D)
        exact_path = full.last_path
        uniform = v.double().mean(dim=2, keepdim=True).expand_as(exact)  # every key weighted 1/N
        rows.append(_row(options, "uniform (mean of v)", "", "", length, uniform - exact, exact,
                         "baseline: no attention", exact_path.path, on_row))
        for sweep in options.sweeps:
            defaults = attn.attention_info(sweep.variant).params
            for setting in sweep.settings():
                params = {**setting, **({"max_len": length} if "max_len" in defaults else {})}
                torch.manual_seed(options.seed)  # learned parameters' initialisation
                module = attn.create_attention(sweep.variant, num_heads=options.heads,
                                               head_dim=options.head_dim, **params).eval()
                with torch.no_grad():
                    diff = module(q, k, v).double() - exact  # (B, H, N, D)
                size = setting.get(sweep.param, "") if sweep.param else ""
                rows.append(_row(options, sweep.variant, sweep.param or "", size, length, diff, exact,
                                 getattr(module.last_path, "path", ""), exact_path.path, on_row))
    return rows


def _row(options: ApproxOptions, variant: str, param: str, size: Any, length: int, diff: torch.Tensor,
         exact: torch.Tensor, path: str, exact_path: str, on_row) -> dict[str, Any]:
    row = {
        "variant": variant, "param": param, "size": size, "seq_len": length,
        "rel_fro": float(diff.norm() / exact.norm()), "max_abs": float(diff.abs().max()),
        "path": path, "exact_path": exact_path, "batch": options.batch, "heads": options.heads,
        "head_dim": options.head_dim, "seed": options.seed,
    }
    setting = f" {param}={size}" if param else ""
    on_row(f"{variant}{setting} N={length}: rel_fro={row['rel_fro']:.3e} max_abs={row['max_abs']:.3e}")
    return row


def report_markdown(df: pd.DataFrame, env: dict[str, Any]) -> str:
    """A table of relative errors (variant and size x N), then every row with both errors."""
    table = df.assign(setting=[f"{v} ({p}={s})" if p else v if v.startswith("uniform") else
                               f"{v} (no size parameter)" for v, p, s in zip(df.variant, df.param, df["size"])])
    wide = table.pivot_table(index="setting", columns="seq_len", values="rel_fro", sort=False)
    wide.columns = [f"N={c}" for c in wide.columns]
    first = df.iloc[0]
    lines = [
        "# Approximation error against exact full attention", "",
        f"Inputs q, k, v ~ N(0, 1), B={first.batch} H={first.heads} D={first.head_dim}, seed {first.seed}, "
        "non-causal, no padding; exact attention by the `full` variant's kernel "
        f"({first.exact_path}). Learned parameters at their seeded initialisation "
        "(Linformer: untrained random projections, `max_len = N`). `uniform (mean of v)` weights "
        "every key 1/N: the error of no attention at all. A relative error above 1 is farther "
        "from exact attention than a zero output.", "",
        "## Relative Frobenius error ||out - exact||_F / ||exact||_F", "",
        markdown_table(wide.reset_index()), "",
        "## Every measurement", "",
        markdown_table(df[["variant", "param", "size", "seq_len", "rel_fro", "max_abs", "path"]]), "",
        "## Environment", "",
    ]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def plot_errors(df: pd.DataFrame, path: Path) -> None:
    """One panel per variant: relative Frobenius error against N (log-log), a line per size."""
    import matplotlib  # plotting stack: heavy, imported only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plotting stack
    import seaborn as sns  # plotting stack

    sns.set_theme(style="whitegrid", context="paper")
    variants = list(dict.fromkeys(df.variant))
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), squeeze=False, sharey=True)
    for ax, variant in zip(axes[0], variants):
        part = df[df.variant == variant]
        for size, group in part.groupby("size", sort=False):
            label = f"{group.param.iloc[0]}={size}" if group.param.iloc[0] else "(no size parameter)"
            ax.plot(group.seq_len, group.rel_fro, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(variant)
        ax.set_xlabel("sequence length N")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("||out - exact||_F / ||exact||_F")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_approx_error(options: ApproxOptions, out: Path) -> pd.DataFrame:
    check_sweeps(options.sweeps)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; give a directory (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(options.threads):
        rows = error_rows(options)
    env = environment("cpu", options.threads)
    df = pd.DataFrame(rows)
    df.assign(git_sha=env["git_sha"], torch_version=env["torch_version"]).to_csv(out / "errors.csv", index=False)
    write_env(out, [env])
    atomic_write_text(out / "report.md", report_markdown(df, env))
    plot_errors(df, out / "errors.png")
    print(f"wrote {out / 'report.md'}, {out / 'errors.csv'}, {out / 'errors.png'}")
    return df
