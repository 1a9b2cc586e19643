"""Instruction counts per kernel call (``attn-bench count``), counted by callgrind: a deterministic measure of a
kernel's work on a noisy machine (docs/measurement.md, "Instructions")."""
