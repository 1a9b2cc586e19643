"""The ``attn-bench`` command line: importing its modules registers their commands on :data:`app`; each command
imports what it needs when it runs, so ``attn-bench --help`` starts fast."""

from bench.cli import approx, count, decoding, history, reproduce, runs, sweep, train, tune, variants  # noqa: F401  (registers the commands)
from bench.cli.app import app, main
from bench.cli.common import UsageError, user_errors

__all__ = ["UsageError", "app", "main", "user_errors"]
