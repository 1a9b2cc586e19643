"""Instruction counts per kernel call (``attn-bench count``): a deterministic measure of the
work a kernel does, for a noisy shared machine where wall-clock times drift.

:mod:`bench.counting.counter` finds a counter that works here (Valgrind's callgrind) or says
precisely what is missing; :mod:`bench.counting.probe` is the script that runs inside the
counter; :mod:`bench.counting.run` runs it and writes ``counts.csv``, ``summary.md`` and
``env.json``. How to read the numbers and their limits: ``docs/measurement.md``.
"""
