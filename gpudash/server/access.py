"""Who may talk to a gpudash server: one rule for the dashboard and for ``/metrics``.

* Binding anything but loopback needs a token (``--token`` or ``$GPUDASH_TOKEN``),
  checked on every request (``Authorization: Bearer``, ``?token=`` or the cookie
  the dashboard sets).
* Every request must name this server in its ``Host`` header: loopback names
  always, the bound address (or this machine's names for a wildcard bind) when
  exposed, and names given with ``--allow-host``. A page on another site that
  re-points its DNS name at 127.0.0.1 (DNS rebinding) gets a 403.

    check_bind(host, token)                       # UserError before anything listens
    app = guard(app, token=token, hosts=allowed_hosts(host))
    server, thread = serve_wsgi(app, host, port)
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode

from gpudash.errors import UserError

__all__ = ["FRAME_ANCESTORS", "MIN_TOKEN_CHARS", "TOKEN_ENV", "allowed_hosts", "check_bind", "check_token",
           "guard", "host_name", "is_loopback", "resolve_token", "security_headers", "serve_wsgi", "token_from_env",
           "token_ok"]

TOKEN_ENV = "GPUDASH_TOKEN"
COOKIE = "gpudash_token"
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: The shortest token accepted (a guessable one guards nothing once the server is on the network).
MIN_TOKEN_CHARS = 16
#: Pages that may frame the dashboard: its own origin (a notebook through Jupyter's proxy), a notebook
#: served from this machine (the IFrame of ``gpudash.server.notebook.show`` at 127.0.0.1), VS Code's notebooks;
#: ``$GPUDASH_FRAME_ANCESTORS`` adds sources (e.g. ``https://hub.example.org``). No ``[::1]``: CSP source
#: expressions take no IPv6 literal, and Chromium reports one as an error on every page.
FRAME_ANCESTORS = ("'self'", "http://127.0.0.1:*", "http://localhost:*",
                   "https://127.0.0.1:*", "https://localhost:*", "vscode-webview:")
FRAME_ANCESTORS_ENV = "GPUDASH_FRAME_ANCESTORS"


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(flag: str | None) -> str | None:
    """The token given on the command line, else ``$GPUDASH_TOKEN`` (empty: unset), else None;
    a token too weak to guard anything raises :class:`UserError` (:func:`check_token`)."""
    if flag is not None:
        check_token(flag, "--token")
        return flag
    env = os.environ.get(TOKEN_ENV)
    if not env:
        return None
    check_token(env, f"${TOKEN_ENV}")
    return env


def token_from_env(flag: str | None) -> bool:
    """Whether the token in use came from ``$GPUDASH_TOKEN`` (then it is never printed)."""
    return flag is None and bool(os.environ.get(TOKEN_ENV))


def check_token(token: str, where: str = "the token") -> None:
    """A token must be at least :data:`MIN_TOKEN_CHARS` characters, not all whitespace (one-line UserError)."""
    if not token.strip():
        raise UserError(f"{where} is empty or only whitespace: pass a random secret of {MIN_TOKEN_CHARS}+ "
                        "characters (python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    if len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"{where} is {len(token)} characters: use {MIN_TOKEN_CHARS} or more "
                        "(python -c 'import secrets; print(secrets.token_urlsafe(24))')")


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise UserError(f"binding {host or '0.0.0.0'} exposes your runs to the network: pass --token SECRET "
                        f"(or set {TOKEN_ENV}), or keep the default --host 127.0.0.1")
    if not is_loopback(host) and token is not None:
        check_token(token)


def host_name(header: str) -> str | None:
    """The host of a ``Host`` header without its port, lower case; None when malformed."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        name, rest = header[1:end], header[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = header.partition(":")
    if (port and not port.isdigit()) or not name or any(c in name for c in "/@\\ ?#"):
        return None
    return name.rstrip(".")


def _machine_names() -> set[str]:
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            names |= {a.address.split("%")[0].lower() for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}
    except Exception:  # noqa: BLE001 - no interface list: the names above and --allow-host remain
        pass
    return names


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Host names this server answers to; ``"*"`` in ``extra`` turns the check off."""
    names = set(_LOOPBACK_NAMES) | {e.strip().lower().strip("[]").rstrip(".") for e in extra if e.strip()}
    bind = bind_host.strip().lower()
    if bind in _WILDCARDS:
        names |= _machine_names()
    elif not is_loopback(bind):
        names.add(bind.strip("[]").rstrip("."))
    return frozenset(names)


def _host_ok(header: str | None, hosts: frozenset[str]) -> bool | None:
    """True/False for a well-formed header, None for a malformed one."""
    if header is None or "*" in hosts:
        return True  # no Host header: not a browser, so not a rebinding page
    name = host_name(header)
    if name is None:
        return None
    return name in hosts or is_loopback(name)


def token_ok(token: str, *, authorization: str = "", cookie: str = "", query: str = "") -> bool:
    supplied = [cookie, query]
    if authorization[:7].lower() == "bearer ":
        supplied.append(authorization[7:].strip())
    return any(s and hmac.compare_digest(s.encode(), token.encode()) for s in supplied)


def _plain(start_response: Callable[..., Any], status: str, text: str) -> list[bytes]:
    body = (text + "\n").encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
    return [body]


def _cookie_path(req: Any) -> str:
    """Where the browser sees this server: the prefix a proxy strips (jupyter-server-proxy sends it as
    ``X-Forwarded-Prefix``) or the mount point, so two servers behind one Jupyter keep apart their cookies.
    Trusting the header only narrows where the browser sends the cookie."""
    prefix = req.headers.get("X-Forwarded-Prefix", "") or req.script_root
    return prefix.rstrip("/") + "/" if re.fullmatch(r"[A-Za-z0-9/_.~%-]*", prefix) else "/"


def security_headers() -> list[tuple[str, str]]:
    """Headers on every answer: no ``Referer`` leaves a page (its URL may carry ``?token=``), and only
    the pages of :data:`FRAME_ANCESTORS` may frame it (no click-jacking from another site)."""
    extra = [s for s in os.environ.get(FRAME_ANCESTORS_ENV, "").split() if re.fullmatch(r"[\w.:/*\[\]-]+", s)]
    return [("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy", "frame-ancestors " + " ".join([*FRAME_ANCESTORS, *extra]))]


def _with_headers(start_response: Callable[..., Any]) -> Callable[..., Any]:
    added = security_headers()

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        have = {k.lower() for k, _ in headers}
        headers = list(headers) + [(k, v) for k, v in added if k.lower() not in have]
        return start_response(status, headers, exc_info) if exc_info is not None else start_response(status, headers)

    return start


def guard(app: Callable[..., Any], *, token: str | None, hosts: frozenset[str],
          browser: bool = False) -> Callable[..., Any]:
    """A WSGI app that answers only requests naming an allowed host and, with ``token``, carrying it.

    ``browser``: a page opened with ``?token=`` is redirected to the same page without it, the token
    moved into an HttpOnly cookie (kept out of the address bar and history)."""
    from werkzeug.http import dump_cookie
    from werkzeug.wrappers import Request

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        start_response = _with_headers(start_response)
        ok = _host_ok(environ.get("HTTP_HOST"), hosts)
        if ok is None:
            return _plain(start_response, "400 Bad Request", "gpudash: malformed Host header")
        if not ok:
            name = host_name(environ["HTTP_HOST"])
            return _plain(start_response, "403 Forbidden",
                          f"gpudash: this server does not answer for host {name!r} (DNS-rebinding guard); "
                          f"open it as 127.0.0.1 or localhost, or start it with --allow-host {name}")
        if not token:
            return app(environ, start_response)
        req = Request(environ)
        if not token_ok(token, authorization=req.headers.get("Authorization", ""),
                        cookie=req.cookies.get(COOKIE, ""), query=req.args.get("token", "")):
            return _plain(start_response, "401 Unauthorized",
                          "gpudash: this server needs its token: open the URL printed by 'gpudash serve' "
                          "(…?token=...) or send 'Authorization: Bearer TOKEN'")
        if browser and req.args.get("token") and req.method == "GET" and not req.path.startswith("/api/"):
            args = {k: v for k, v in req.args.items() if k != "token"}
            location = req.script_root + req.path + ("?" + urlencode(args) if args else "")
            start_response("302 Found", [("Location", location), ("Content-Length", "0"),
                                         ("Set-Cookie", dump_cookie(COOKIE, token, path=_cookie_path(req),
                                                                    httponly=True, samesite="Strict"))])
            return [b""]
        return app(environ, start_response)

    return checked


def serve_wsgi(app: Callable[..., Any], host: str, port: int, name: str) -> tuple[Any, threading.Thread]:
    """Serve ``app`` on ``host:port`` (0: a free port) from a daemon thread, one thread per request,
    without a log line per request. Returns (server, thread); ``server.shutdown()`` stops it.
    A port already in use raises ``OSError`` (``errno.EADDRINUSE``)."""
    from werkzeug.serving import WSGIRequestHandler, get_sockaddr, make_server, select_address_family

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:  # one line per request drowns the console
            pass

    # bound here: a busy port raises OSError to the caller (werkzeug would print its own lines and exit)
    family = select_address_family(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
        sock.bind(get_sockaddr(host, port, family))
        sock.listen(128)
        server = make_server(host, port, app, threaded=True, request_handler=QuietHandler, fd=sock.fileno())
    # what HTTPServer.server_bind would have set (it does not run for a socket passed in)
    server.server_name, server.server_port = str(server.server_address[0]), int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return server, thread
