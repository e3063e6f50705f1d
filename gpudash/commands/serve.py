"""``gpudash serve RUNS_DIR``: serve the dashboard for a folder of runs (and alerts for its live runs)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpudash.commands._flags import add_alert_arguments, add_server_arguments, alerts_from_args
from gpudash.errors import UserError
from gpudash.server.access import TOKEN_ENV, resolve_token, token_from_env
from gpudash.server.app import serve_in_thread
from gpudash.store.localdisk import CACHE_MB, CACHE_MB_ENV, cache_limit, parse_cache_mb, set_cache_limit
from gpudash.store.objstore import is_url, open_store, run_name
from gpudash.units import human_bytes

if TYPE_CHECKING:
    from gpudash.store.runsync import RunsMirror

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", default="runs",
                   help="a directory of runs, or an object-store prefix of runs such as s3://bucket/runs "
                        "(default: runs)")
    add_server_arguments(p)
    p.add_argument("--metrics", action="store_true",
                   help="also serve Prometheus metrics of every run at /metrics (for Grafana)")
    add_alert_arguments(p)  # alerts for every live run served (a run killed with kill -9 included)
    p.add_argument("--endpoint-url", default=None, metavar="URL",
                   help="an S3-compatible server for s3:// (MinIO, Ceph: http://host:9000); default "
                        "$AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL, else AWS")
    p.add_argument("--cache-mb", default=None, metavar="MB",
                   help="runs in an object store: the most local disk their opened runs' fetched segments take "
                        f"(least recently read run dropped first, never one open now; default ${CACHE_MB_ENV} "
                        f"or {CACHE_MB:,})")


def run(args: argparse.Namespace) -> int:
    from gpudash.server.deferred import defer, without

    # this process only serves: dash's Jupyter support (IPython, ~0.1 s) is never used, and numpy and pandas
    # load after the first page is answered, while the browser fetches its scripts (gpudash.server.deferred)
    without("IPython")
    defer("numpy")
    defer("pandas")
    from gpudash.store.runid import list_run_dirs

    _cache_limit(getattr(args, "cache_mb", None))
    if getattr(args, "endpoint_url", None):
        _endpoint(args.endpoint_url)
    mirror = None
    if is_url(args.runs_dir):
        mirror = _mirror(args.runs_dir)
        runs_dir = mirror.local
    else:
        runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir():
        raise UserError(f"{runs_dir}: no such directory (pass the folder your runs are written to)")
    if not list_run_dirs(runs_dir) and resolve_is_run(runs_dir):
        print(f"gpudash: {runs_dir} is a run; serving its parent folder {runs_dir.resolve().parent}")
        runs_dir = runs_dir.resolve().parent
    token = resolve_token(args.token)
    try:
        alert_opts = alerts_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        url, stop = serve_in_thread(runs_dir, args.host, args.port, token, metrics=args.metrics,
                                    allow_hosts=args.allow_host, head_start=True)
    except OSError as exc:
        import errno

        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {args.port} is busy (another process listens on {args.host}:{args.port}): "
                            f"pass --port N, or stop the other process") from None
        raise UserError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); pick another --port") from None
    if token_from_env(args.token):  # a secret kept in the environment is never printed to a terminal or a log
        url = url.split("?token=")[0] + f"?token=${TOKEN_ENV}"
    shown = (f"{args.runs_dir} (listed every {mirror.every_s:g} s; a run's segments are fetched when it is "
             f"opened, into a local cache of at most {human_bytes(cache_limit())}: --cache-mb)"
             if mirror else runs_dir)
    print(f"gpudash: serving {shown} at {url}  (Ctrl-C to stop)", flush=True)
    alerts = None
    if alert_opts is not None:
        from gpudash.alerts.watch import ServeAlerts
        from gpudash.options import AlertOptions

        base = alert_opts.get("dashboard_url") or url.split("?")[0].rstrip("/")  # links never carry the token
        alerts = ServeAlerts(runs_dir, AlertOptions(**alert_opts), base)
    try:
        while True:
            time.sleep(3600)
    finally:
        if alerts is not None:
            alerts.stop()
        stop()
        if mirror is not None:
            mirror.stop()


def _endpoint(url: str) -> None:
    """``--endpoint-url``: the S3-compatible server every s3:// client of this process talks to."""
    import os

    from gpudash.store.objstore import ENDPOINT_ENV

    if not url.startswith(("http://", "https://")):
        raise UserError(f"--endpoint-url {url!r}: not a URL (e.g. --endpoint-url http://minio:9000)")
    os.environ[ENDPOINT_ENV] = url  # every client this process opens (s3fs, botocore) reads it


def _cache_limit(flag: str | None) -> None:
    """The bound of the opened runs' fetched segments: the flag, else the environment (a bad value: one line)."""
    import os

    try:
        if flag is not None:
            set_cache_limit(parse_cache_mb(str(flag)))
        elif os.environ.get(CACHE_MB_ENV):
            set_cache_limit(parse_cache_mb(os.environ[CACHE_MB_ENV], CACHE_MB_ENV))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _mirror(url: str) -> RunsMirror:
    """The runs under an object-store prefix, their metadata listed into a private local folder that the
    dashboard serves, each run's segments fetched when it is opened (:mod:`gpudash.store.runsync`); a prefix that is itself a run is served as that one
    run (never its parent: only what is under the prefix asked for is read)."""
    from gpudash.errors import RunError
    from gpudash.store.localdisk import staging_dir
    from gpudash.store.runsync import RunsMirror

    try:
        open_store(url)  # only the prefix asked for is ever read (a prefix that is a run is served as one run)
        mirror = RunsMirror(url, staging_dir("serve") / run_name(url))
    except RunError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - whatever the driver raises: one line
        raise UserError(f"{url}: cannot read the store ({type(exc).__name__}: {str(exc)[:200]}); check the URL, "
                        "the credentials (AWS_*) and the endpoint (AWS_ENDPOINT_URL)") from None
    mirror.start()
    return mirror


def resolve_is_run(path: Path) -> bool:
    from gpudash.store.reader import is_run_dir

    return is_run_dir(path)
