"""``gpudash serve RUNS_DIR``: the Dash app, its JSON API and its token check.

Wiring only: pages, figures and the callbacks (thin wrappers over pure
functions) live in :mod:`gpudash.server.layouts`; here are the Flask routes, the
token check and the server thread (the CLI is :mod:`gpudash.commands.serve`).

    app = create_app(Path("runs"))            # a dash.Dash; app.server is Flask
    url, stop = serve_in_thread(Path("runs"), "127.0.0.1", 0)

Dash, Flask and the pages are imported when the app is made, after the port is bound: ``serve --help``
answers at once, and a browser opened right away waits for the first page instead of being refused.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpudash.errors import RunError
from gpudash.server.access import allowed_hosts, check_bind, guard, serve_wsgi
from gpudash.store.atomic import write_atomic
from gpudash.store.bounded import damage

if TYPE_CHECKING:
    import dash

    from gpudash.server.layouts.callbacks import ReaderCache

__all__ = ["create_app", "serve_in_thread"]

#: Where the script bundles are served from: the same bytes for the server's life, compressed once.
_BUNDLES = "/_dash-component-suites/"


class _BundleCache:
    """Flask-Compress's cache: keeps the compressed script bundles (plotly.js's cartesian bundle is 1.5 MB, ~0.4 MB
    as brotli), never a page or a callback answer (those differ per request). Kept in memory and in gpudash's
    cache folder (``bundles/`` under :func:`gpudash.store.summarystore.cache_dir`; off with
    ``GPUDASH_CACHE_DIR=off``), so a server started again sends them without compressing them again (~70 ms of
    a cold start). The key on disk names the file's version: the address (Dash's bundle addresses carry their
    package's version and the file's modification time, plotly.js's its size and mtime) and the versions of
    gpudash, Dash and Flask-Compress; each file starts with its bytes' SHA-256 (a damaged file is not sent). A
    cache: a folder that cannot be read or written is skipped."""

    KEEP = 64  # files on disk; the oldest go first

    def __init__(self) -> None:
        import dash
        import flask_compress

        from gpudash._version import __version__
        from gpudash.store.summarystore import cache_dir

        self._data: dict[str, bytes] = {}
        # in the key on disk: Dash asks its lazily loaded scripts at addresses without a version (async-graph.js)
        self._versions = f"gpudash {__version__}, dash {dash.__version__}, flask-compress {flask_compress.__version__}"
        folder = cache_dir()
        self._dir = folder / "bundles" if folder is not None else None

    def _file(self, key: str) -> Path:
        assert self._dir is not None
        return self._dir / hashlib.sha256(f"{key}|{self._versions}".encode()).hexdigest()

    def get(self, key: str) -> bytes | None:
        hit = self._data.get(key)
        if hit is None and self._dir is not None and _BUNDLES in key:
            try:
                stored = self._file(key).read_bytes()
            except OSError:
                return None
            digest, hit = stored[:32], stored[32:]
            if hashlib.sha256(hit).digest() != digest:  # damaged on disk: compressed again, and stored again
                self._file(key).unlink(missing_ok=True)
                return None
            if len(self._data) < 256:
                self._data[key] = hit
        return hit

    def set(self, key: str, value: bytes) -> None:
        if _BUNDLES not in key:
            return
        if len(self._data) < 256:
            self._data[key] = value
        if self._dir is None:
            return
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            path = self._file(key)
            write_atomic(path, hashlib.sha256(value).digest() + value)  # a reader never sees half a bundle
            kept = sorted(self._dir.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in kept[self.KEEP:]:
                old.unlink(missing_ok=True)
        except OSError:
            pass


def _dash_class() -> Any:
    """``dash.Dash`` whose pages load plotly.js's cartesian bundle (``layouts.style.PLOTLY_BUNDLE``, 1.5 MB)
    in place of the full 4.8 MB one: the browser's first paint spends ~0.8 s less evaluating it. Only this
    app: another Dash app in the same process (a notebook's) keeps the full plotly.js."""
    import dash

    from gpudash.server.layouts.style import PLOTLY_BUNDLE

    namespace, rel = PLOTLY_BUNDLE.split("/", 1)

    class GpudashDash(dash.Dash):
        def _collect_and_register_resources(self, resources: Any, include_async: bool = True,
                                            url_attr: str = "src") -> Any:
            swapped = [dict(r, namespace=namespace, relative_package_path=rel, external_url=None)
                       if r.get("namespace") == "plotly" and str(r.get("relative_package_path", "")).endswith(
                           "plotly.min.js") else r for r in resources]
            return super()._collect_and_register_resources(swapped, include_async, url_attr)

    return GpudashDash


def _warm(app: Any, token: str | None, runs_dir: Path, head_start: bool) -> None:
    """While no browser waits for it: compress plotly.js into the cache (its first request answers at once).
    With ``head_start`` (``gpudash serve``'s own process, never a training process or a notebook's kernel):
    also finish the imports the pages need (numpy and pandas, which ``serve`` deferred) and read the newest
    run's facts and snapshots into the caches (its page then builds in about half the time), the browser's requests
    meanwhile getting the interpreter every 1 ms, not 5. Not the pages themselves: a page being built holds its
    run's lock, and the browser's first request would wait for it. Only a head start: a failure here leaves it
    to the first request."""
    headers = {"Accept-Encoding": "br"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        from gpudash.server.layouts.style import PLOTLY_URL

        client = app.server.test_client()
        client.get("/", headers=headers)  # the index registers the bundles' paths
        client.get(_BUNDLES + PLOTLY_URL, headers=headers)
        if not head_start:
            return
        from gpudash.server.deferred import finish

        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, 0.001))
        try:
            finish("numpy")
            finish("pandas")
            from gpudash.server.layouts.pages import warm_run
            from gpudash.store.runid import list_run_dirs

            newest = max(list_run_dirs(runs_dir), key=lambda r: r[1].stat().st_mtime, default=None)
            if newest is not None:
                warm_run(newest[1])
        finally:
            sys.setswitchinterval(switch)
    except Exception:  # noqa: BLE001 - only a head start: the first browser pays for it otherwise
        pass


def _install_compression(server: Any) -> None:
    """brotli (else gzip) on the page, the callback answers and the script bundles; under the token and
    Host guard, which wraps the whole Flask app."""
    from flask_compress import Compress

    server.config.update(COMPRESS_ALGORITHM=["br", "gzip"], COMPRESS_BR_LEVEL=5, COMPRESS_LEVEL=6,
                         COMPRESS_STREAMS=False, COMPRESS_CACHE_BACKEND=_BundleCache,
                         COMPRESS_CACHE_KEY=lambda req: req.full_path if req.path.find(_BUNDLES) >= 0
                         else f"{req.method} {req.full_path} {id(req)}")
    Compress(server)


def _install_api(server: Any, runs_dir: Path, readers: ReaderCache) -> None:
    from flask import jsonify, request

    from gpudash.server.layouts import memory, runs, throughput
    from gpudash.server.layouts.data import load_view
    from gpudash.server.layouts.pages import verdicts_for
    from gpudash.store.runid import InvalidRunId, resolve_run_dir

    @server.get("/api/runs")
    def api_runs() -> Any:
        # paged like the runs page (newest first, search and status filter before paging): a folder of
        # thousands of runs answers without summarising every one
        args = request.args
        try:
            page = int(args.get("page", "0"))
            per_page = int(args.get("per_page", str(runs.PER_PAGE)))
        except ValueError:
            return jsonify({"error": "page and per_page must be whole numbers"}), 400
        if not (0 <= page < 1_000_000 and 1 <= per_page <= 1000):
            return jsonify({"error": "page must be >= 0 and per_page between 1 and 1000"}), 400
        status = args.get("status") or None
        if status not in (None, *(v for v, _ in runs.STATUS_FILTERS)):
            return jsonify({"error": f"status must be one of {[v for v, _ in runs.STATUS_FILTERS]}"}), 400
        listing = runs.list_page(runs_dir, args.get("q", "")[:500], status, page, per_page)
        return jsonify({"runs_dir": str(runs_dir), "runs": listing.rows, "page": listing.page,
                        "pages": listing.pages, "matching": listing.matching, "total": listing.total})

    @server.get("/api/runs/<run_id>/summary")
    def api_summary(run_id: str) -> Any:
        try:
            path = resolve_run_dir(runs_dir, run_id)
        except InvalidRunId:
            return jsonify({"error": "no such run"}), 404
        out = runs.run_summary(run_id, path)
        try:
            reader, lock = readers.get(run_id)
            with lock:
                view = load_view(reader)
        except (InvalidRunId, RunError) as exc:
            out["problems"].append(str(exc))
            return jsonify(out)
        except Exception as exc:  # noqa: BLE001 - a run too damaged to view: its one line, never a 500
            out["problems"].append(f"{run_id}: unreadable ({damage(exc)})")
            return jsonify(out)
        out["meta"] = {k: v for k, v in view.meta.items() if k not in ("argv", "pid", "heartbeat")}
        out["throughput"] = throughput.throughput_stats((out.get("facts") or {}).get("recent"))
        out["memory_now"] = memory.memory_at(view.frame("memory"), None)
        ev = view.frame("events")
        out["events"] = {str(k): int(v) for k, v in ev["kind"].value_counts().items()} if len(ev) else {}
        out["stability"] = (out.get("facts") or {}).get("lights") or []
        verdicts = verdicts_for(path)
        out["verdicts"] = None if verdicts is None else [
            v.as_dict() if hasattr(v, "as_dict") else {"title": str(getattr(v, "title", v))} for v in verdicts]
        return jsonify(out)

    @server.route("/api/<path:rest>")
    def api_unknown(rest: str) -> Any:
        return jsonify({"error": "no such API route", "routes": ["/api/runs", "/api/runs/<run_id>/summary"]}), 404


def create_app(runs_dir: Path, *, token: str | None = None, metrics: bool = False, host: str = "127.0.0.1",
               allow_hosts: Iterable[str] = (), requests_pathname_prefix: str = "/") -> dash.Dash:
    """The dashboard for the runs in ``runs_dir``; with ``token`` every route requires it. Requests must
    name the server in their Host header (:func:`gpudash.server.access.allowed_hosts` of ``host``).

    ``requests_pathname_prefix``: the path the browser reaches the server under (a proxy that strips it,
    e.g. Jupyter's ``/user/NAME/proxy/PORT/``); the server answers under it as well as at ``/``."""
    from dash import dcc, html

    from gpudash.server.layouts.callbacks import ReaderCache, register_callbacks
    from gpudash.server.layouts.inputs import BadInput
    from gpudash.server.layouts.links import PREFIX_KEY
    from gpudash.server.layouts.style import index_string

    runs_dir = Path(runs_dir)
    no_title: Any = None  # no "Updating..." tab-title flicker on every live tick
    app = _dash_class()(__name__, title="gpudash", update_title=no_title, suppress_callback_exceptions=True,
                    assets_folder=str(Path(__file__).parent / "layouts" / "no-assets"),
                    requests_pathname_prefix=requests_pathname_prefix)
    app.index_string = index_string(prefix=quote(requests_pathname_prefix)).replace(
        "<a href='/'>", f"<a href='{quote(requests_pathname_prefix)}'>")
    app.server.config[PREFIX_KEY] = requests_pathname_prefix  # in-page links go under it (layouts.links.href)
    app.layout = html.Div([dcc.Location(id="url", refresh="callback-nav"), dcc.Store(id="shown-page"),
                           html.Div(id="page")])
    readers = ReaderCache(runs_dir)
    _install_compression(app.server)
    app.server.wsgi_app = guard(app.server.wsgi_app, token=token,  # type: ignore[method-assign]
                                hosts=allowed_hosts(host, allow_hosts), browser=True)
    if requests_pathname_prefix.strip("/"):  # also mounted under the prefix: the same URL works by SSH forward
        from werkzeug.middleware.dispatcher import DispatcherMiddleware

        app.server.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
            app.server.wsgi_app, {"/" + requests_pathname_prefix.strip("/"): app.server.wsgi_app})
    _install_api(app.server, runs_dir, readers)
    app.server.register_error_handler(
        BadInput, lambda exc: (f"gpudash: bad request: {exc}\n", 400, {"Content-Type": "text/plain; charset=utf-8"}))
    if metrics:  # Prometheus /metrics beside the dashboard (behind the same token)
        from gpudash.server.metrics import register_metrics

        register_metrics(app.server, runs_dir)
    register_callbacks(app, runs_dir, readers)
    return app


def serve_in_thread(runs_dir: Path, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None, metrics: bool = False,
                    allow_hosts: Iterable[str] = (),
                    prefix_for_port: Callable[[int], str] | None = None,
                    head_start: bool = False) -> tuple[str, Callable[[], None]]:
    """Serve the dashboard from a daemon thread; returns (url, stop). Port 0 picks a free port.
    ``prefix_for_port``: the ``requests_pathname_prefix`` for the port bound (a proxy path naming it).
    ``head_start``: this process only serves (``gpudash serve``): after the address, load what the first page
    needs in the background (see ``_warm``)."""
    check_bind(host, token)
    # bound first, so the prefix can name the port; a request that comes while the app is made waits for it
    answer: list[Any] = []
    ready = threading.Event()

    def when_ready(environ: dict[str, Any], start: Callable[..., Any]) -> Any:
        if not ready.wait(120) or not answer:
            start("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"gpudash: the dashboard did not start\n"]
        return answer[0](environ, start)

    server, thread = serve_wsgi(when_ready, host, port, "gpudash-serve")
    try:
        app = create_app(Path(runs_dir), token=token, metrics=metrics, host=host, allow_hosts=allow_hosts,
                         requests_pathname_prefix=prefix_for_port(server.server_port) if prefix_for_port else "/")
    except BaseException:
        ready.set()
        server.shutdown()
        server.server_close()
        raise
    answer.append(app.server)
    ready.set()
    threading.Thread(target=_warm, args=(app, token, Path(runs_dir), head_start), name="gpudash-warm",
                     daemon=True).start()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/" + (f"?token={token}" if token else "")

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return url, stop
