"""The quality half of the suite: tasks, training, grids, the quality report and plots.

- :mod:`bench.quality.tasks`: the long-range tasks (data from packages or generated);
- :mod:`bench.quality.settings`: task presets (``bench/configs/tasks/<preset>.yaml``);
- :mod:`bench.quality.train`: one resumable training run (``attn-bench train``);
- :mod:`bench.quality.grid`: tasks x variants x seeds (``attn-bench sweep <grid config>``);
- :mod:`bench.quality.report` and :mod:`bench.quality.plots`: the table and the figures.
"""
