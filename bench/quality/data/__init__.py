"""Data layer of the quality benchmark: offline, deterministic datasets as numpy arrays.

Nothing here downloads or loads data at import time; every dataset comes from an installed
package or a seeded generator, and a missing one raises
:class:`bench.quality.data.errors.DataMissingError` naming the install command.
"""
