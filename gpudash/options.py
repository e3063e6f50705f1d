"""``MonitorOptions``: the knobs of the Monitor and its collectors (``gpudash.Monitor(..., host_hz=0)``),
and ``AlertOptions``, nested in it: what raises an alert and where it goes (``Monitor(alerts=...)``,
``gpudash run|train|serve --alert-webhook URL``).

Imports nothing from gpudash, so the collectors, the Monitor and the trainer's
config all read it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ALERT_KINDS", "DEFAULT_PORT", "AlertOptions", "MonitorOptions", "alert_options", "check_webhook_url"]

#: The dashboard's port when none is asked for (serve, demo, run --serve).
DEFAULT_PORT = 8050

#: Every kind of alert gpudash raises (the rules live in gpudash.analysis.alerts).
ALERT_KINDS = ("nonfinite", "loss_spike", "oom", "stall", "headroom", "alloc_retries", "straggler",
               "precision_fallback", "crashed")


def check_webhook_url(url: str) -> str:
    """``url`` when it is an http(s) URL on one line; else ValueError with a one-line fix."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        raise ValueError(f"alert webhook {str(url)[:200]!r}: pass an http:// or https:// URL "
                         "(e.g. a Slack or Discord incoming-webhook URL)")
    return url


@dataclass(kw_only=True, slots=True)
class AlertOptions:
    """What raises an alert and where it goes. Alerts are raised off the training thread, from the run's
    recorded rows (the same rules as every surface); a slow or dead webhook never slows training."""

    webhook: str | None = None
    """POST each alert as JSON to this http(s) URL (Slack's ``text`` and Discord's ``content`` included)."""
    desktop: bool = True
    """Also show a desktop notification (``notify-send``) where one is available."""
    terminal: bool = True
    """Also print each alert on stderr, prefixed ``gpudash:``."""
    record: bool = True
    """Record each alert as an ``alert`` event in the run (dashboard events, report)."""
    kinds: tuple[str, ...] = ALERT_KINDS
    """The kinds that alert (see ALERT_KINDS)."""
    cooldown_s: float = 300.0
    """After an alert, a new episode of the same kind within this many seconds is counted, not sent."""
    stall_factor: float = 10.0
    """A stall: no step for this many times the recent step period ..."""
    stall_min_s: float = 60.0
    """... and for at least this many seconds."""
    headroom_pct: float = 5.0
    """Memory creep: the step's memory within this share (%) of the card's capacity."""
    poll_s: float = 0.5
    """Seconds between looks at the run's newest rows."""
    dashboard_url: str = f"http://127.0.0.1:{DEFAULT_PORT}"
    """Where the dashboard serves the runs: an alert links to ``<dashboard_url>/run/<run>``."""
    timeout_s: float = 5.0
    """Seconds one webhook request may take before it counts as failed."""
    retries: int = 3
    """Attempts after a failed webhook request (backoff 0.5 s, 1 s, 2 s, ...); then the alert is dropped."""
    queue_size: int = 100
    """Alerts waiting for the webhook; more are dropped (and counted)."""

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_webhook_url(self.webhook)
        self.kinds = tuple(self.kinds)
        unknown = [k for k in self.kinds if k not in ALERT_KINDS]
        if unknown:
            raise ValueError(f"unknown alert kind(s) {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(ALERT_KINDS)}")
        for name in ("cooldown_s", "stall_min_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"alerts {name} must be >= 0 seconds")
        if self.stall_factor < 1:
            raise ValueError("alerts stall_factor must be >= 1 (times the recent step period)")
        if not 0 <= self.headroom_pct < 100:
            raise ValueError("alerts headroom_pct must be between 0 and 100")
        if self.poll_s <= 0 or self.timeout_s <= 0:
            raise ValueError("alerts poll_s and timeout_s must be > 0 seconds")
        if self.retries < 0 or self.queue_size < 1:
            raise ValueError("alerts retries must be >= 0 and queue_size >= 1")
        if not self.dashboard_url.startswith(("http://", "https://")):
            raise ValueError(f"alerts dashboard_url {self.dashboard_url[:200]!r}: pass an http:// or https:// URL")


def alert_options(value: Any) -> AlertOptions | None:
    """``Monitor(alerts=...)``: None/False (off), True (on: terminal, desktop, run events), a webhook URL,
    a dict of AlertOptions fields (what JSON configs carry), or AlertOptions."""
    if value is None or value is False:
        return None
    if value is True:
        return AlertOptions()
    if isinstance(value, AlertOptions):
        return value
    if isinstance(value, str):
        return AlertOptions(webhook=value)
    if isinstance(value, dict):
        try:
            return AlertOptions(**value)
        except TypeError as exc:
            raise ValueError(f"bad alert option: {exc}") from None
    raise ValueError(f"alerts={type(value).__name__}: pass True, a webhook URL, a dict or AlertOptions")


@dataclass(kw_only=True, slots=True)
class MonitorOptions:
    """Knobs of the Monitor and its collectors; defaults keep the cost inside the budget."""

    flush_interval: float = 0.5
    """Seconds between writer flushes; a SIGKILL loses at most about this much."""
    buffer_records: int = 200_000
    """Records held in memory before the oldest is dropped (and counted)."""
    host_hz: float = 1.0
    """psutil samples per second (0 turns the host collector off)."""
    memory_every: int = 1
    """Record memory by category every N steps (parameters, gradients, optimizer, ...)."""
    activations_every: int = 0
    """Measure saved activations every N steps; 0 picks N so the cost stays <= activations_budget."""
    activations_budget: float = 0.005
    """Target share of step time spent in the activation hooks when activations_every is 0."""
    device_hz: float = 10.0
    """NVML samples per second (GPU only; 0 turns it off)."""
    allocator: bool = True
    """Read torch.cuda.memory_stats() once per step (GPU only)."""
    cuda_timing: bool = True
    """Time phases with CUDA events, resolved off the training thread (GPU only)."""
    snapshot_every: int = 0
    """Take an allocator snapshot every N steps (0: only on demand and at OOM)."""
    stacks_hz: float = 0.0
    """py-spy samples per second of this process (0: off)."""
    handle_signals: bool = True
    """Install a SIGTERM handler that flushes and records why the run ended."""
    alerts: Any = None
    """Alerts during the run (AlertOptions; also True, a webhook URL or a dict of its fields; None: off)."""

    def __post_init__(self) -> None:
        if self.flush_interval <= 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if self.buffer_records < 100:
            raise ValueError("buffer_records must be >= 100")
        for name in ("host_hz", "device_hz", "stacks_hz"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.memory_every < 1:
            raise ValueError("memory_every must be >= 1")
        if self.activations_every < 0 or self.snapshot_every < 0:
            raise ValueError("activations_every and snapshot_every must be >= 0")
        self.alerts = alert_options(self.alerts)
