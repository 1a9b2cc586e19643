"""Offline HTML pages of a run (``report.html``) and of the history across runs (``history.html``)."""
