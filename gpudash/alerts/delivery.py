"""Where alerts go: a webhook, the desktop, the terminal and the run's own events.

Nothing here runs on the training thread: the watcher (gpudash.alerts.watch) calls :meth:`Delivery.deliver`
from its own thread, and the slow sinks (the webhook, ``notify-send``) each have a daemon thread behind a
bounded queue. A webhook that fails or hangs costs a request timeout on that thread, retries with backoff,
and then the alert is dropped and counted; the queue never grows past ``AlertOptions.queue_size``.

Also the one place the command line reads alert options: ``--alert-webhook URL`` and ``--alert KEY=VALUE``
on ``gpudash run``, ``gpudash train`` and ``gpudash serve`` (stdlib only, so parsing a flag loads nothing).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from gpudash._version import __version__
from gpudash.options import AlertOptions, alert_options, field_types, from_text

if TYPE_CHECKING:
    from gpudash.analysis.alerts import Alert

__all__ = ["Delivery", "DesktopNotifier", "WebhookSender", "add_alert_arguments", "alert_payload",
           "alerts_from_args", "run_link"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_DISCORD_MAX = 2000


def say(msg: str) -> None:
    print(f"gpudash: {msg}", file=sys.stderr, flush=True)


# ---- the command line: one path for run, train and serve ---------------------------------------------
def add_alert_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--alert-webhook", default=None, metavar="URL",
                   help="alert during the run: POST each alert (NaN loss, spike, OOM, stall, memory near the card, "
                        "allocator retries, straggler, precision fallback, crash, leak) as JSON to URL (Slack, Discord "
                        "or any http(s) receiver); alerts also go to stderr, the desktop and the run's events")
    p.add_argument("--alert", action="append", default=[], metavar="KEY=VALUE",
                   help=f"an AlertOptions field (turns alerts on; repeatable): {', '.join(f.name for f in fields(AlertOptions))}"
                        "; e.g. cooldown_s=60, headroom_pct=10, kinds=nonfinite,oom,crashed, desktop=false")


def _parse_alert_items(items: list[str]) -> dict[str, Any]:
    """``["cooldown_s=60", "kinds=oom,crashed"]`` -> AlertOptions fields, each read by its field's type."""
    types = field_types(AlertOptions)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ValueError(f"--alert {item!r}: expected KEY=VALUE with KEY one of {', '.join(types)}")
        try:
            out[key] = from_text(types[key], value)
        except ValueError as exc:
            raise ValueError(f"--alert {item!r}: {exc}") from None
    return out


def alerts_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The AlertOptions fields the flags ask for (a JSON-able dict, as MonitorOptions(alerts=...) takes it),
    checked here: None when no alert flag was given. Raises ValueError with one line naming the flag."""
    webhook = getattr(args, "alert_webhook", None)
    items = list(getattr(args, "alert", None) or [])
    if webhook is None and not items:
        return None
    out = _parse_alert_items(items)
    if webhook is not None:
        out["webhook"] = webhook
    opts = alert_options(out)  # every mistake now, in one line, not mid-run
    assert opts is not None
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


# ---- the payload -------------------------------------------------------------------------------------
def run_link(dashboard_url: str, run_id: str) -> str:
    return f"{dashboard_url.rstrip('/')}/run/{quote(run_id)}"


def alert_payload(run: str, alert: Alert, link: str | None, now: float | None = None) -> dict[str, Any]:
    """The webhook's JSON body: the alert's fields, and ``text`` (Slack) / ``content`` (Discord) for chat."""
    where = f" step {alert.step}" if alert.step is not None else ""
    line = f"gpudash [{run}]{where}: {alert.text}"
    # Slack reads <...> as links and mentions: the run's own text (an OOM message, a name) is escaped there
    slack = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") + (f" <{link}|run page>" if link else "")
    return {"run": run, "step": alert.step, "kind": alert.kind, "message": alert.text, "rank": alert.rank,
            "where": alert.where, "link": link, "time": time.time() if now is None else now,
            "data": alert.data, "text": slack, "content": (line + (f" {link}" if link else ""))[:_DISCORD_MAX],
            "allowed_mentions": {"parse": []}}  # Discord: an "@everyone" in the run's text pings nobody


# ---- the slow sinks: a daemon thread each, behind a bounded queue ------------------------------------------
class _Worker:
    def __init__(self, name: str, handle: Callable[[Any], None], size: int) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._handle = handle
        self.stopping = threading.Event()
        self.dropped = 0
        self.closed = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Any) -> bool:
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._busy = True
            try:
                self._handle(item)
            except Exception:  # noqa: BLE001 - a sink's failure is counted by the sink, never raised
                self.dropped += 1
            finally:
                self._busy = False

    def close(self, timeout: float) -> None:
        """Send what is queued, waiting at most ``timeout`` seconds; what is still queued or in flight then is
        left to the daemon thread and counted as dropped."""
        if self.closed:
            return
        deadline = time.monotonic() + timeout
        while (self._busy or not self._q.empty()) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.stopping.set()  # no more backoff waits
        self.closed = True
        self.dropped += self._q.qsize() + (1 if self._busy else 0)
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))


class WebhookSender:
    """POSTs JSON to a URL from a daemon thread: ``timeout_s`` per request, ``retries`` more attempts with
    backoff (0.5 s, 1 s, 2 s, ...; none on a 4xx but 429), then dropped. ``sent`` / ``dropped`` count."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, retries: int = 3, queue_size: int = 100) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.sent = 0
        self.failed = 0
        self.last_error: str | None = None
        host = urlsplit(url).hostname or ""
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)
        self._worker = _Worker("gpudash-alert-webhook", self._post, queue_size)

    @property
    def dropped(self) -> int:
        """Alerts that never reached the receiver: the queue was full, or every attempt failed."""
        return self._worker.dropped + self.failed

    def send(self, payload: dict[str, Any]) -> bool:
        return self._worker.submit(json.dumps(payload, default=str).encode())

    def _post(self, body: bytes) -> None:
        for attempt in range(self.retries + 1):
            if attempt and self._worker.stopping.is_set():
                break
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": f"gpudash/{__version__}"})
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    resp.read(4096)
                self.sent += 1
                return
            except urllib.error.HTTPError as exc:
                self.last_error = f"HTTP {exc.code}"
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the receiver refuses this request: the same one again will not do better
            except (OSError, ValueError, http.client.HTTPException) as exc:
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            if attempt < self.retries:
                self._worker.stopping.wait(0.5 * 2**attempt)
        if not self._worker.closed:  # once closed, an alert still in flight is already counted as dropped
            self.failed += 1

    def close(self, timeout: float) -> None:
        self._worker.close(timeout)


class DesktopNotifier:
    """``notify-send`` when it is on PATH; otherwise not available (said once, on the first alert)."""

    def __init__(self) -> None:
        self.path = shutil.which("notify-send")
        self._said = False
        self._worker = _Worker("gpudash-alert-desktop", self._show, 20) if self.path else None

    def notify(self, title: str, text: str) -> None:
        if self._worker is None:
            if not self._said:
                self._said = True
                say("desktop notifications are not available here (no notify-send on PATH); alerts still go to "
                    "the other places asked for")
            return
        self._worker.submit((title, text))

    def _show(self, item: tuple[str, str]) -> None:
        assert self.path is not None
        title, text = item
        try:
            subprocess.run([self.path, "--app-name=gpudash", title, text[:500]], timeout=5, check=False,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            pass  # no display or notification daemon: nothing to show it on

    def close(self, timeout: float) -> None:
        if self._worker is not None:
            self._worker.close(timeout)


class Delivery:
    """Every sink ``options`` asks for. ``record(alert)`` stores an alert in the run (the training process
    passes the Monitor's; a server has none: it never writes into a run)."""

    def __init__(self, options: AlertOptions, record: Callable[[Alert], None] | None = None) -> None:
        self.options = options
        self.record = record if options.record else None
        self.webhook = (WebhookSender(options.webhook, timeout_s=options.timeout_s, retries=options.retries,
                                      queue_size=options.queue_size) if options.webhook else None)
        self.desktop = DesktopNotifier() if options.desktop else None
        self.delivered = 0

    def deliver(self, run: str, alert: Alert, link: str | None) -> None:
        self.delivered += 1
        if self.options.terminal:
            say(f"alert [{run}]" + (f" step {alert.step}" if alert.step is not None else "") + f": {alert.text}")
        if self.record is not None:
            try:
                self.record(alert)
            except Exception:  # noqa: BLE001 - the alert still goes out
                pass
        if self.webhook is not None:
            self.webhook.send(alert_payload(run, alert, link))
        if self.desktop is not None:
            self.desktop.notify(f"gpudash: {run}", alert.text)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"raised": self.delivered}
        if self.webhook is not None:
            out.update(webhook_sent=self.webhook.sent, webhook_dropped=self.webhook.dropped)
            if self.webhook.last_error:
                out["webhook_last_error"] = self.webhook.last_error
        return out

    def close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for sink in (self.webhook, self.desktop):
            if sink is not None:
                sink.close(max(0.0, deadline - time.monotonic()))
