"""Approximation error against length (``attn-bench approx-error``): how far each
approximate variant's output is from exact full attention on the same seeded inputs, as the
sequence grows and as the variant's size parameter grows (:mod:`bench.approx.error`)."""
