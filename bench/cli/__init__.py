"""The ``attn-bench`` command line: list, sweep, train, plot, report, compare, reproduce, history, check,
decoding, decoding-step, approx-error, count.

Every command imports what it needs when it runs, so ``attn-bench --help`` starts fast. Bad
input (a config, an option, a run directory) is one line naming the argument and the
allowed values, exit code 2; ``--debug`` shows the traceback instead. One module per group
of commands; importing them registers the commands on :data:`app`.
"""

from bench.cli import approx, count, decoding, history, reproduce, runs, sweep, train, variants  # noqa: F401  (registers the commands)
from bench.cli.app import app, main
from bench.cli.common import UsageError, user_errors

__all__ = ["UsageError", "app", "main", "user_errors"]
