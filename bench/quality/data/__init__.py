"""Data layer of the quality benchmark: offline, deterministic datasets as numpy arrays.

Nothing here downloads anything or loads data at import time; every dataset comes from an
installed package (or is generated from a seed) and a missing one raises
:class:`bench.quality.data.errors.DataMissingError` naming the install command.

Modules:

- ``errors``: :class:`DataMissingError` (one-line message with the install command).
- ``cache``: cache directory for generated data and an atomic load-or-generate ``.npz`` helper.
- ``splits``: deterministic train/val/test index splits (optionally grouped or stratified).
- ``listops``: ListOps expressions generated with the Long Range Arena algorithm.
- ``bbc``: BBC News articles (5 classes) as UTF-8 bytes, plus same-category retrieval pairs.
- ``fashion_mnist``: Fashion-MNIST images read from the Debian package's IDX files.
- ``pathfinder``: generated Pathfinder images (two dots, dashed curved paths, distractors).
- ``enwiki``: raw bytes of the enwiki XML excerpt shipped with gensim's test data.
- ``bible``: King James / Reina-Valera 1909 verse pairs, cleaning, shared BPE tokenizer.
- ``recall``: synthetic associative recall at controlled query-to-key distances.
- ``mqar``: synthetic multi-query associative recall (many pairs, every key queried).
"""
