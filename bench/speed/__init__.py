"""Speed sweeps: cases, their isolated workers timed in interleaved rounds, scaling fits,
reports, plots and the regression gate (``attn-bench sweep``, ``report``, ``plot``,
``compare``)."""
