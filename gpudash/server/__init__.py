"""The dashboard process: the Dash app and its HTTP API (``app``), access control (``access``),
Prometheus ``/metrics`` (``metrics``, names in ``promnames``), the Jupyter embed (``notebook``),
what is loaded after the first answer (``deferred``), the caches of open runs and summaries
(``runcache``, ``summarystore``) and the pages themselves (``layouts/``).

The training side never imports anything here (tests/test_layers.py follows every import).
"""
