"""The quality half of the suite: tasks, training, grids, the quality report and plots.

- :mod:`bench.quality.tasks`: the long-range tasks (data from packages or generated) and their
  registry (``register_task``, ``list_tasks``, ``task_info``);
- :mod:`bench.quality.settings`: task presets (the defaults in
  ``bench/configs/tasks/<preset>.yaml``, each task's own sections from its registration);
- :mod:`bench.quality.train` and :mod:`bench.quality.trainer`: one resumable training run
  (``attn-bench train``) and its training loop;
- :mod:`bench.quality.grid_config`, :mod:`bench.quality.units` and :mod:`bench.quality.grid`:
  tasks x variants x seeds, their units and their run directory (``attn-bench sweep <grid
  config>``);
- :mod:`bench.quality.tables`, :mod:`bench.quality.report` and :mod:`bench.quality.plots`: the
  tables, the report and the figures;
- :mod:`bench.quality.data`: the datasets, offline and deterministic.
"""
