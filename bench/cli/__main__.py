"""``python -m bench.cli``: the same as the ``attn-bench`` command."""

from bench.cli import main

main()
