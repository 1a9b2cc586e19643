"""The script ``attn-bench count`` runs under callgrind, ``python -m bench.counting.probe SPEC.json RESULT.json``:
per length an empty region and a kernel region (docs/measurement.md, "Instructions"), the paths that ran into
RESULT.json."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

from attn import create_attention
from bench.counting.counter import start_instrumentation


def _empty(q: Any, k: Any, v: Any, causal: bool) -> None:
    """The harness's call: the same arguments, no work."""


def _count_region(fn: Any, args: tuple, calls: int) -> None:
    """``calls`` calls of ``fn(*args)`` with counting on, then one dump."""
    gc.collect()
    gc.disable()
    torch._C._valgrind_toggle()
    for _ in range(calls):
        fn(*args)
    torch._C._valgrind_toggle_and_dump_stats()
    gc.enable()


def main(spec_path: str, result_path: str) -> None:
    """Count every length of the spec; write the paths that ran."""
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    torch.manual_seed(0)
    att = create_attention(spec["variant"], kernel=spec["kernel"], num_heads=spec["heads"],
                           head_dim=spec["head_dim"], **spec["params"])
    dtype = getattr(torch, spec["dtype"])
    start_instrumentation()  # after the imports: every call below runs instrumented
    paths = []
    with torch.inference_mode():
        for length in spec["seq_len"]:
            shape = (spec["batch"], spec["heads"], length, spec["head_dim"])
            q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))  # (B, H, N, D)
            causal = spec["causal"]

            def kernel(q: Any, k: Any, v: Any, causal: bool) -> None:
                att(q, k, v, causal=causal)

            for _ in range(spec["warmup"]):
                kernel(q, k, v, causal)
            _count_region(_empty, (q, k, v, causal), spec["calls"])
            _count_region(kernel, (q, k, v, causal), spec["calls"])
            path = att.last_path
            paths.append({"seq_len": length, "kernel": path.kernel, "path": path.path,
                          "fallback": path.fallback or "", "mask_emulated": path.mask_emulated})
    Path(result_path).write_text(json.dumps(paths))


if __name__ == "__main__":
    main(*sys.argv[1:3])
