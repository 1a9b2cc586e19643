"""The quality product: tasks, training, training grids, the quality report and figures (its modules:
docs/layout.md)."""
