"""``attn-bench count``: :mod:`bench.counting.probe` under callgrind once for all lengths, into ``counts.csv`` (a
row per length), ``summary.md`` and ``env.json``."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import bench
from attn import AttentionCall, create_attention
from bench.counting.counter import no_counter_message, run_callgrind, valgrind_version
from bench.counting.options import CountOptions
from bench.engine.fsutil import atomic_write_text
from bench.engine.provenance import environment
from bench.engine.results import write_env

#: the folder above the ``bench`` package, first on the counted process's path: it runs this checkout's code
SOURCE_ROOT = Path(bench.__file__).resolve().parents[1]


def check_kernel_runs(options: CountOptions) -> None:
    """``ValueError`` naming ``--kernel`` when it cannot run the counted calls (before minutes under callgrind)."""
    att = create_attention(options.variant, kernel=options.kernel, num_heads=options.heads,
                           head_dim=options.head_dim, **options.params)
    for length in options.seq_len:
        call = AttentionCall(torch.device("cpu"), getattr(torch, options.dtype), options.causal,
                             q_len=length, k_len=length, head_dim=options.head_dim)
        reasons = att.not_supported_reasons(call)
        if reasons:
            raise ValueError(f"--kernel: {options.kernel!r} cannot run {options.variant} at N={length}: "
                             f"{'; '.join(reasons)}")


def count_rows(options: CountOptions) -> list[dict[str, Any]]:
    """A row per length of ``options``' kernel counted; ``ValueError`` when no counter or kernel can run here."""
    refusal = no_counter_message()
    if refusal is not None:
        raise ValueError(refusal)
    check_kernel_runs(options)
    with tempfile.TemporaryDirectory(prefix="attn-count-") as tmp:
        work = Path(tmp)
        spec, result = work / "spec.json", work / "paths.json"
        spec.write_text(json.dumps(options.probe_spec()))
        counts = run_callgrind(
            [sys.executable, "-m", "bench.counting.probe", str(spec), str(result)], work,
            options.timeout_s, {"PYTHONPATH": str(SOURCE_ROOT), "OMP_NUM_THREADS": "1"},
        )
        paths = json.loads(result.read_text())
    if len(counts) != 2 * len(options.seq_len):
        raise RuntimeError(f"callgrind wrote {len(counts)} counted regions; expected "
                           f"{2 * len(options.seq_len)} (an empty and a kernel region per length)")
    rows = []
    for i, path in enumerate(paths):
        empty, total = counts[2 * i], counts[2 * i + 1]
        rows.append({
            "variant": options.variant, "params": json.dumps(options.params, sort_keys=True),
            "kernel_requested": options.kernel, "kernel": path["kernel"], "path": path["path"],
            "fallback": path["fallback"], "mask_emulated": path["mask_emulated"],
            "seq_len": path["seq_len"], "batch": options.batch, "heads": options.heads,
            "head_dim": options.head_dim, "dtype": options.dtype, "causal": options.causal,
            "calls": options.calls, "instructions_total": total, "harness_total": empty,
            "instructions_per_call": (total - empty) / options.calls,
            "counter": "callgrind", "counter_version": valgrind_version(),
        })
    return rows


def summary_markdown(rows: pd.DataFrame, env: dict[str, Any]) -> str:
    """The report: provenance, how the count was made, one line per length."""
    first = rows.iloc[0].to_dict()  # a dict: a Series' own attributes (dtype) would shadow columns
    lines = ["# Instructions per call", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += [
        "",
        f"`{first['variant']}` {first['params']}, kernel `{first['kernel_requested']}`, q/k/v "
        f"({first['batch']}, {first['heads']}, N, {first['head_dim']}) {first['dtype']}, "
        f"causal={first['causal']}, one torch thread. Counted by {first['counter_version']} "
        f"(callgrind): {first['calls']} calls per "
        "length after warm-up, less the same number of calls of an empty function with the "
        "same arguments (the harness). Instructions, not time: see docs/measurement.md.",
        "",
        "| N | kernel that ran | path | instructions per call | per call / N | harness per call |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for row in rows.itertuples():
        note = f" (fallback: {row.fallback})" if row.fallback else ""
        lines.append(
            f"| {row.seq_len} | {row.kernel} | {row.path}{note} | {row.instructions_per_call:,.0f} | "
            f"{row.instructions_per_call / row.seq_len:,.0f} | {row.harness_total / row.calls:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def run_count(options: CountOptions, out: Path) -> None:
    """Count, then write ``counts.csv``, ``summary.md`` and ``env.json`` into ``out``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; give a directory (it is created if missing)")
    rows = pd.DataFrame(count_rows(options))
    env = environment("cpu", 1)
    rows = rows.assign(git_sha=env["git_sha"], torch_version=env["torch_version"],
                       timestamp=env["timestamp"])
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "counts.csv", index=False)
    write_env(out, [env])
    summary = summary_markdown(rows, env)
    atomic_write_text(out / "summary.md", summary)
    print(summary)
