"""Prometheus ``/metrics`` for a directory of runs: the latest values, for Grafana.

A custom ``prometheus_client`` collector (:mod:`gpudash.server.scrape`) reads the newest rows of each run on
every scrape (through :class:`gpudash.store.RunReader`, so it works in any
process and never touches the training loop) and exposes them with units in
the names and ``run``, ``rank``, ``node`` (the rank's host) and ``gpu`` labels::

    gpudash_step_duration_seconds{run="exp1",rank="0",node="gpu-a1"} 0.212
    gpudash_tokens_per_second{run="exp1",rank="0",node="gpu-a1"} 38612.0
    gpudash_memory_allocated_bytes{run="exp1",rank="0",node="gpu-a1"} 7.3e9
    gpudash_memory_category_bytes{run="exp1",rank="0",node="gpu-a1",category="activations"} 2.1e9
    gpudash_device_power_watts{run="exp1",rank="0",node="gpu-a1",gpu="0"} 312.0
    gpudash_step_skew_ratio{run="ddp"} 0.18      # torchrun: the straggler indicator
    gpudash_run_tokens_per_second{run="exp1"} 38012.0   # the run's facts: whole run, all ranks
    gpudash_mfu_ratio{run="exp1"} 0.41          # last 100 steps (gpudash.analysis.rates)

Mount it in the dashboard (``register_metrics(app.server, runs_dir)``), as a
plain WSGI app (``metrics_wsgi_app``), or on its own port
(``serve_metrics(runs_dir, port)``; also ``python -m gpudash.server.metrics RUNS_DIR``),
or from the training process itself, opt-in:
``monitor.add_collector(MetricsServer(port=9479))``.
Each series is its newest value carried forward (a column written every N
steps keeps its last value between writes). Finished runs stay, unless
``max_age_s`` (``--metrics-max-age``) drops those that ended longer ago. The
run-level facts (steps, OOMs counted once, loss spikes, non-finite steps,
measured peak) come from :mod:`gpudash.analysis.facts`, as every other surface
shows them (not from the in-process ``MetricsServer``: they load the whole run);
phases are the run's recorded phase set.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, make_wsgi_app

from gpudash.errors import UserError
from gpudash.server.access import allowed_hosts, check_bind, guard, resolve_token, serve_wsgi
from gpudash.server.scrape import RunsCollector, metric_name, metrics_registry, prometheus_name

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer as WSGIServer

__all__ = [
    "DEFAULT_PORT",
    "MetricsServer",
    "RunsCollector",
    "main",
    "metrics_registry",
    "metrics_wsgi_app",
    "metric_name",
    "prometheus_name",
    "register_metrics",
    "serve_metrics",
]

DEFAULT_PORT = 9479


def metrics_wsgi_app(runs_dir: str | os.PathLike[str], **collector_kwargs: Any) -> Callable[..., Any]:
    """A WSGI app answering the Prometheus text format (mount it at ``/metrics``)."""
    return make_wsgi_app(metrics_registry(runs_dir, **collector_kwargs))  # type: ignore[no-any-return]


def register_metrics(server: Any, runs_dir: str | os.PathLike[str], path: str = "/metrics",
                     **collector_kwargs: Any) -> None:
    """Add a ``/metrics`` route to a Flask app (a Dash app's ``app.server``)."""
    registry = metrics_registry(runs_dir, **collector_kwargs)

    def metrics() -> tuple[bytes, int, dict[str, str]]:
        return generate_latest(registry), 200, {"Content-Type": CONTENT_TYPE_LATEST}

    server.add_url_rule(path, endpoint="gpudash_metrics", view_func=metrics)


def serve_metrics(runs_dir: str | os.PathLike[str], port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                  token: str | None = None, allow_hosts: Iterable[str] = (), **collector_kwargs: Any) -> WSGIServer:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the server
    (``server.shutdown()`` stops it; ``server.server_port`` is the port when 0 was asked).
    Use ``host="0.0.0.0"`` so a Prometheus on another machine can scrape it; that needs ``token``
    (or ``$GPUDASH_TOKEN``), sent by Prometheus as ``authorization: {credentials: TOKEN}``.
    The same rules as ``gpudash serve`` (:mod:`gpudash.server.access`)."""
    token = resolve_token(token)
    check_bind(host, token)
    app = guard(metrics_wsgi_app(runs_dir, **collector_kwargs), token=token, hosts=allowed_hosts(host, allow_hosts))
    server, _thread = serve_wsgi(app, host, port, "gpudash-metrics")
    return server


class MetricsServer:
    """A Monitor collector that serves the run's ``/metrics`` from the training process.

    Opt-in: ``monitor.add_collector(MetricsServer(port=9479))``. Only rank 0
    serves (it exposes every rank of the run folder), so torchrun ranks on one
    machine do not fight over the port. Stops when the Monitor closes."""

    name = "metrics"

    def __init__(self, port: int = DEFAULT_PORT, host: str = "127.0.0.1", token: str | None = None) -> None:
        self.port = port
        self.host = host
        self.token = resolve_token(token)
        check_bind(host, self.token)  # here, not in start(): a config mistake is said before training
        self.server: WSGIServer | None = None

    def start(self, monitor: Any) -> None:
        if monitor.rank == 0:
            # no run-level facts here: they load the whole run, work that must not compete with training
            self.server = serve_metrics(monitor.run_dir, self.port, self.host, self.token, max_age_s=None, facts=False)

    @property
    def url(self) -> str | None:
        return None if self.server is None else f"http://{self.host}:{self.server.server_port}/metrics"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpudash.server.metrics", description="Serve /metrics for a runs folder.")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to let other machines scrape (needs --token)")
    p.add_argument("--token", default=None,
                   help="require this bearer token on every scrape (default: $GPUDASH_TOKEN); "
                        "needed to bind anything but loopback")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests addressed to NAME ('*': any)")
    p.add_argument("--metrics-max-age", type=float, default=None, metavar="SECONDS",
                   help="drop runs that ended more than SECONDS ago (default: keep every run)")
    args = p.parse_args(argv)
    if args.metrics_max_age is not None and args.metrics_max_age < 0:
        print("gpudash: error: --metrics-max-age must be >= 0 seconds (or leave it out to keep every run)",
              file=sys.stderr)
        return 2
    if not Path(args.runs_dir).is_dir():
        print(f"gpudash: error: {args.runs_dir}: no such directory (pass the folder your runs are written to)",
              file=sys.stderr)
        return 2
    try:
        server = serve_metrics(args.runs_dir, args.port, args.host, args.token, args.allow_host,
                               max_age_s=args.metrics_max_age)
    except UserError as exc:
        print(f"gpudash: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gpudash: error: cannot listen on {args.host}:{args.port} ({exc.strerror}); pick another --port",
              file=sys.stderr)
        return 2
    print(f"gpudash metrics for {args.runs_dir} at http://{args.host}:{server.server_port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
