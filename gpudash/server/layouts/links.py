"""In-page links under the path the browser reaches the dashboard by.

Behind a proxy that strips a prefix (Jupyter's ``/user/NAME/proxy/PORT/``,
the app's ``requests_pathname_prefix``) a ``dcc.Link`` to ``/run/x`` would
leave the proxy; every in-page link goes through :func:`href`, which puts the
prefix of the app serving this request in front (none outside a request, and
none for an app served at ``/``). The router strips it again.
"""

from __future__ import annotations

from flask import current_app, has_app_context

__all__ = ["PREFIX_KEY", "href"]

#: Where :func:`gpudash.server.app.create_app` keeps its ``requests_pathname_prefix`` (the Flask server's config).
PREFIX_KEY = "GPUDASH_PATH_PREFIX"


def href(path: str) -> str:
    """``/run/x`` as the browser must ask for it: ``/user/alice/proxy/8050/run/x`` behind that prefix."""
    prefix = str(current_app.config.get(PREFIX_KEY) or "") if has_app_context() else ""
    return prefix.rstrip("/") + path
