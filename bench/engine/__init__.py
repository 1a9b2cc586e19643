"""The engine the three products (speed sweeps, training grids, decoding) run on: configs and
their limits, run directories and their results files, executors, isolated worker processes,
measurement and provenance. It imports no product (docs/layout.md)."""
