"""Approximation error against length (``attn-bench approx-error``, :mod:`bench.approx.error`)."""
