"""The quality tasks' datasets as numpy arrays, offline and deterministic: nothing is loaded at import,
and a missing one raises :class:`bench.quality.data.errors.DataMissingError` naming its install command."""
