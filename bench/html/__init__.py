"""Offline HTML pages of run directories (``report.html``) and of a history across runs
(``history.html``): Plotly figures and sortable, filterable tables, scripts and data inline."""
