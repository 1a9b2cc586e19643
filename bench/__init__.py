"""Benchmark harness: measuring, sweeping, results, plots and the ``attn-bench`` CLI."""
