"""``gpudash serve RUNS_DIR``: the Dash app, its JSON API and its token check.

Wiring only: pages, figures and the callbacks (thin wrappers over pure
functions) live in :mod:`gpudash.layouts`; here are the Flask routes, the
token check, the server thread and the CLI.

    app = create_app(Path("runs"))            # a dash.Dash; app.server is Flask
    url, stop = serve_in_thread(Path("runs"), "127.0.0.1", 0)
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import dash
from dash import dcc, html
from flask import Response, jsonify, redirect, request

from gpudash.errors import UserError
from gpudash.layouts import memory, runs, throughput
from gpudash.layouts.callbacks import ReaderCache, register_callbacks
from gpudash.layouts.data import load_view
from gpudash.layouts.pages import verdicts_for
from gpudash.layouts.runid import InvalidRunId, list_run_dirs, resolve_run_dir
from gpudash.layouts.style import index_string
from gpudash.store.reader import RunError

__all__ = ["add_arguments", "create_app", "run", "serve_in_thread"]

TOKEN_ENV = "GPUDASH_TOKEN"
_COOKIE = "gpudash_token"

def _token_ok(token: str) -> bool:
    supplied = [request.cookies.get(_COOKIE, ""), request.args.get("token", "")]
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        supplied.append(auth[7:])
    return any(s and hmac.compare_digest(s.encode(), token.encode()) for s in supplied)


def _install_token_check(server: Any, token: str) -> None:
    @server.before_request
    def check_token() -> Any:
        if not _token_ok(token):
            return Response("gpudash: this dashboard needs its token: open the URL printed by "
                            "'gpudash serve' (…?token=...)\n", status=401, mimetype="text/plain")
        if request.args.get("token") and request.method == "GET" and not request.path.startswith("/api/"):
            # keep the token out of the address bar and history: move it into a cookie
            args = {k: v for k, v in request.args.items() if k != "token"}
            resp = redirect(request.path + ("?" + urlencode(args) if args else ""))
            resp.set_cookie(_COOKIE, token, httponly=True, samesite="Strict")
            return resp
        return None


def _install_api(server: Any, runs_dir: Path, readers: ReaderCache) -> None:
    @server.get("/api/runs")
    def api_runs() -> Any:
        return jsonify({"runs_dir": str(runs_dir), "runs": runs.list_runs(runs_dir)})

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
        out["meta"] = {k: v for k, v in view.meta.items() if k not in ("argv", "pid", "heartbeat")}
        out["throughput"] = throughput.throughput_stats(view.frame("steps"), view.meta)
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


def create_app(runs_dir: Path, *, token: str | None = None, metrics: bool = False) -> dash.Dash:
    """The dashboard for the runs in ``runs_dir``; with ``token`` every route requires it."""
    runs_dir = Path(runs_dir)
    no_title: Any = None  # no "Updating..." tab-title flicker on every live tick
    app = dash.Dash(__name__, title="gpudash", update_title=no_title, suppress_callback_exceptions=True,
                    assets_folder=str(Path(__file__).parent / "layouts" / "no-assets"))
    app.index_string = index_string()
    app.layout = html.Div([dcc.Location(id="url", refresh="callback-nav"), html.Div(id="page")])
    readers = ReaderCache(runs_dir)
    if token:
        _install_token_check(app.server, token)
    _install_api(app.server, runs_dir, readers)
    if metrics:  # Prometheus /metrics beside the dashboard (behind the same token)
        from gpudash.metrics import register_metrics

        register_metrics(app.server, runs_dir)
    register_callbacks(app, runs_dir, readers)
    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_bind(host: str, token: str | None) -> None:
    if not _is_loopback(host) and not token:
        raise UserError(f"binding {host} exposes your runs to the network: pass --token SECRET "
                        f"(or set {TOKEN_ENV}), or keep the default --host 127.0.0.1")


def serve_in_thread(runs_dir: Path, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None, metrics: bool = False) -> tuple[str, Callable[[], None]]:
    """Serve the dashboard from a daemon thread; returns (url, stop). Port 0 picks a free port."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:  # one line per request drowns the console
            pass

    _check_bind(host, token)
    app = create_app(Path(runs_dir), token=token, metrics=metrics)
    server = make_server(host, port, app.server, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="gpudash-serve", daemon=True)
    thread.start()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/" + (f"?token={token}" if token else "")

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return url, stop


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", type=Path, default=Path("runs"),
                   help="a directory of runs (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8050, help="port (default: 8050)")
    p.add_argument("--token", default=None,
                   help=f"require this token on every page and API call (default: ${TOKEN_ENV}); "
                        "needed to bind anything but loopback")
    p.add_argument("--metrics", action="store_true",
                   help="also serve Prometheus metrics of every run at /metrics (for Grafana)")


def run(args: argparse.Namespace) -> int:
    runs_dir: Path = args.runs_dir
    if not runs_dir.is_dir():
        raise UserError(f"{runs_dir}: no such directory (pass the folder your runs are written to)")
    if not list_run_dirs(runs_dir) and resolve_is_run(runs_dir):
        print(f"gpudash: {runs_dir} is a run; serving its parent folder {runs_dir.resolve().parent}")
        runs_dir = runs_dir.resolve().parent
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not 0 <= args.port < 65536:
        raise UserError(f"--port {args.port}: pick a port between 1 and 65535")
    try:
        url, stop = serve_in_thread(runs_dir, args.host, args.port, token, metrics=args.metrics)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); pick another --port") from exc
    print(f"gpudash: serving {runs_dir} at {url}  (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        stop()


def resolve_is_run(path: Path) -> bool:
    from gpudash.store.reader import is_run_dir

    return is_run_dir(path)
