"""The decoding benchmarks (``attn-bench decoding``, ``decoding-step``); importing the package loads nothing
heavy: the CLI reads :mod:`bench.decoding.options` before torch."""
