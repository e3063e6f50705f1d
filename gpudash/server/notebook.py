"""The live dashboard inline in Jupyter, while the same kernel keeps training.

    monitor = gpudash.Monitor("runs/exp1")
    gpudash.show(monitor)     # or gpudash.show("runs/exp1")
    for batch in loader: ...  # the dashboard above keeps updating

The dashboard server runs on a daemon thread of the kernel, bound to
loopback only. One server per runs folder (and address): calling ``show``
again (for the same run or another run in the same folder) reuses it. The
server outlives the Monitor, so a finished run stays viewable as a replay.

Where the browser is not on the kernel's machine (JupyterHub, JupyterLab
over SSH) the IFrame goes through the Jupyter server's own proxy
(``jupyter-server-proxy``: ``{base_url}proxy/PORT/``), behind Jupyter's login:

* ``proxy=None`` (default): ``$GPUDASH_PROXY_PREFIX`` if set, else the proxy
  of the Jupyter server that runs this kernel when it has jupyter-server-proxy
  (or ``$JUPYTERHUB_SERVICE_PREFIX`` on a hub), else ``http://127.0.0.1:PORT``;
* ``proxy=False``: the loopback URL; ``proxy=True``: the inferred proxy or an error;
* ``proxy="/user/alice/"`` (a Jupyter ``base_url``), ``"/custom/{port}/"`` (a
  path naming the port), either with an origin (``"https://hub.example.org/user/alice/"``).

Behind a proxy the browser's Host header is the Jupyter server's name, so that
server answers any Host but requires a random token (the IFrame carries it once,
then a cookie), the rule of :mod:`gpudash.server.access` for anything not loopback-only.
"""

from __future__ import annotations

import html
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from gpudash.errors import UserError

__all__ = ["PROXY_ENV", "dashboard_url", "local_url", "proxy_template", "show", "shutdown"]

PROXY_ENV = "GPUDASH_PROXY_PREFIX"
_HOST = "127.0.0.1"
_OFF = {"", "0", "off", "no", "none", "false", "loopback"}


@dataclass(frozen=True)
class _Server:
    port: int
    browser_base: str  # what the browser opens, ending in "/": "http://127.0.0.1:PORT/" or a proxy path
    token: str | None
    stop: Callable[[], None]

    @property
    def path_base(self) -> str:  # the same base as a path on the server (it answers there too)
        return urlsplit(self.browser_base).path or "/"


_servers: dict[tuple[Path, str | None], _Server] = {}
_lock = threading.Lock()


def _template(spec: str, where: str) -> str | None:
    """A proxy spec as a prefix template naming ``{port}``; None for loopback."""
    spec = spec.strip()
    if spec.lower() in _OFF:
        return None
    parts = urlsplit(spec)
    if not (spec.startswith("/") or (parts.scheme in ("http", "https") and parts.netloc)) or parts.query:
        raise UserError(f"{where} {spec!r}: give the Jupyter server's base URL path ('/user/NAME/'), a path "
                        "naming the port ('/proxy/{port}/'), either with an origin ('https://hub.example.org"
                        "/user/NAME/'), or 'off' for http://127.0.0.1")
    if "{port}" not in spec:
        spec = spec.rstrip("/") + "/proxy/{port}/"
    return spec.rstrip("/") + "/"


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _jupyter_server() -> dict[str, Any] | None:
    """The running Jupyter server that started this kernel (one of this process's ancestors)."""
    try:
        import psutil
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return None
    try:
        ancestors = {p.pid for p in psutil.Process().parents()}
        return next((s for s in list_running_servers() if s.get("pid") in ancestors), None)
    except Exception:  # noqa: BLE001 - a stale or unreadable server list: no server found
        return None


def _has_server_proxy(server: dict[str, Any]) -> bool | None:
    """Whether ``server`` answers jupyter-server-proxy's own API (the extension is enabled there);
    None when it would not say (a hub's login in the way, no answer)."""
    import urllib.error
    import urllib.request

    url = str(server.get("url", "")).rstrip("/") + "/server-proxy/servers-info"
    token = server.get("token") or os.environ.get("JUPYTERHUB_API_TOKEN", "")
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        return False if exc.code == 404 else None  # 404: no such extension on that server
    except Exception:  # noqa: BLE001 - refused, timeout: unknown
        return None


def proxy_template(proxy: bool | str | None = None) -> str | None:
    """The prefix template (naming ``{port}``) the browser reaches the dashboard under; None: loopback."""
    if isinstance(proxy, str):
        return _template(proxy, "proxy=")
    if proxy is False:
        return None
    if proxy is None and os.environ.get(PROXY_ENV) is not None:
        return _template(os.environ[PROXY_ENV], f"${PROXY_ENV}=")
    if proxy is None and not _in_kernel():
        return None  # a script or terminal: the browser is on this machine
    server = _jupyter_server()
    has_proxy = None if server is None else _has_server_proxy(server)
    if server is not None and has_proxy:
        return _template(str(server.get("base_url") or "/"), "the Jupyter server's base_url")
    hub = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if hub and has_proxy is None:  # a hub's single-user server that would not say: hubs ship the proxy
        return _template(hub, "$JUPYTERHUB_SERVICE_PREFIX")
    if proxy is True:
        raise UserError("no Jupyter server with jupyter-server-proxy runs this kernel: pip install "
                        "jupyter-server-proxy where Jupyter runs and restart it, or pass proxy='/user/NAME/' "
                        f"(or set ${PROXY_ENV})")
    return None


def _server_for(run_path: Path, port: int | None, proxy: bool | str | None) -> _Server:
    template = proxy_template(proxy)
    runs_dir = run_path.parent
    with _lock:
        entry = _servers.get((runs_dir, template))
        if entry is None:
            from gpudash.server.app import serve_in_thread

            if template is None:
                url, stop = serve_in_thread(runs_dir, _HOST, port or 0)
                split = urlsplit(url)
                entry = _Server(int(split.port or 0), url.rstrip("/") + "/", None, stop)
            else:
                token = secrets.token_urlsafe(24)
                bound: list[int] = []

                def prefix_for(p: int) -> str:
                    bound.append(p)
                    return urlsplit(template.format(port=p)).path

                # the proxy forwards the browser's Host (the Jupyter server's name): any Host, with a token
                _, stop = serve_in_thread(runs_dir, _HOST, port or 0, token, allow_hosts=("*",),
                                          prefix_for_port=prefix_for)
                entry = _Server(bound[0], template.format(port=bound[0]), token, stop)
            _servers[(runs_dir, template)] = entry
    return entry


def _page(entry: _Server, run_path: Path, *, local: bool = False) -> str:
    base = f"http://{_HOST}:{entry.port}{entry.path_base}" if local else entry.browser_base
    return f"{base}run/{quote(run_path.name)}" + (f"?token={entry.token}" if entry.token else "")


def dashboard_url(run_dir: str | os.PathLike[str], *, port: int | None = None,
                  proxy: bool | str | None = None) -> str:
    """Start (once per runs folder and address) the dashboard on loopback; return the run page's URL
    as the browser opens it (a loopback URL, or a path through the Jupyter server's proxy).

    The runs folder is ``run_dir``'s parent, so the run's id is its folder name.
    ``port`` is used only when a server is started (None: a free port)."""
    run_path = Path(run_dir).resolve()
    return _page(_server_for(run_path, port, proxy), run_path)


def local_url(run_dir: str | os.PathLike[str], *, port: int | None = None,
              proxy: bool | str | None = None) -> str:
    """The same page at the server's loopback address (for this machine, or an SSH port-forward)."""
    run_path = Path(run_dir).resolve()
    return _page(_server_for(run_path, port, proxy), run_path, local=True)


def _embed(url: str, local: str, port: int, height: int) -> str:
    forward = f"ssh -L {port}:{_HOST}:{port} {socket.gethostname()}"
    return (f'<iframe src="{html.escape(url)}" width="100%" height="{int(height)}" frameborder="0" '
            f'allowfullscreen></iframe>'
            f'<div style="font-size:12px;opacity:0.75">gpudash: not reachable? From your computer run '
            f'<code>{html.escape(forward)}</code> (your SSH name for this machine), then open '
            f'<a href="{html.escape(local)}" target="_blank">{html.escape(local)}</a></div>')


def show(run: Any, *, height: int = 720, port: int | None = None, proxy: bool | str | None = None) -> str:
    """Display the live dashboard of ``run`` (a :class:`~gpudash.Monitor`, or a run folder) inline
    (an IFrame) and return its URL.

    Outside IPython it prints the URL instead, for a browser on this machine."""
    run_dir = getattr(run, "run_dir", run)  # a Monitor (duck-typed: the training side is not imported here)
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"gpudash.show() takes a Monitor or a run folder, not {type(run).__name__}")
    run_path = Path(run_dir).resolve()
    entry = _server_for(run_path, port, proxy)
    url = _page(entry, run_path)
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is None or get_ipython() is None:
        print(f"gpudash dashboard: {url}")
        return url
    display(HTML(_embed(url, _page(entry, run_path, local=True), entry.port, height)))
    return url


def shutdown() -> None:
    """Stop every dashboard server this process started (they are daemon threads;
    a kernel restart stops them too)."""
    with _lock:
        entries = list(_servers.values())
        _servers.clear()
    for entry in entries:
        entry.stop()
