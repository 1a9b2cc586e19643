"""The decoding benchmark: KV-cache decoding and streaming inference of the shared models
(``attn-bench decoding``). Importing the package loads nothing heavy: the CLI reads
:mod:`bench.decoding.options` before torch."""
