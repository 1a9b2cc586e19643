"""Speed sweeps: cases, isolated workers timed in interleaved rounds, scaling fits, reports, plots, the gate."""
