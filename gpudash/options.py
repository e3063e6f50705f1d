"""``MonitorOptions``: the knobs of the Monitor and its collectors (``gpudash.Monitor(..., host_hz=0)``),
and ``AlertOptions``, nested in it: what raises an alert and where it goes (``Monitor(alerts=...)``,
``gpudash run|train|serve --alert-webhook URL``).

Also the one reading of option values from outside Python, for every options dataclass (these and
``TrainConfig``): :func:`cli` marks how a field shows on the command line (the flags themselves are
made from the fields, their types and their docs by ``gpudash.commands._flags``), :func:`from_text`
reads a flag's or a ``KEY=VALUE`` item's text by the field's type, :func:`load` reads a JSON dict (a
config file, a run's meta) and :func:`options_to_json` / :func:`options_from_json` carry
MonitorOptions to a ``gpudash run`` child.

Imports nothing from gpudash, so the collectors, the Monitor and the trainer's
config all read it without importing one another.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, TypeVar
from urllib.parse import urlsplit

__all__ = ["ALERT_KINDS", "DEFAULT_PORT", "AlertOptions", "MonitorOptions", "alert_options", "changed",
           "check_webhook_url", "cli", "field_types", "from_text", "load", "options_from_json", "options_to_json",
           "parse_fields"]

T = TypeVar("T")

#: The dashboard's port when none is asked for (serve, demo, run --serve).
DEFAULT_PORT = 8050

#: Every kind of alert gpudash raises (the rules live in gpudash.analysis.alerts).
ALERT_KINDS = ("nonfinite", "loss_spike", "oom", "stall", "headroom", "alloc_retries", "straggler",
               "precision_fallback", "crashed", "leak", "host_memory", "worker_leak")


def cli(*, flag: str | None = None, aliases: tuple[str, ...] = (), metavar: str | None = None,
        choices: tuple[str, ...] | None = None, repeat: Callable[[list[str]], Any] | None = None,
        default: Any = dataclasses.MISSING, shown: str | None = None, skip: str | None = None) -> dict[str, Any]:
    """A field's ``metadata`` for the command line, where the name, type and default do not say it all:
    ``flag`` another name (``--model``), ``aliases`` older names still read, ``choices`` the values allowed,
    ``repeat`` a repeatable ``KEY=VALUE`` flag read by this function, ``default`` the command line's own
    default (a value, or a function that makes it), ``shown`` how --help states it, ``skip`` why no flag."""
    given = {"flag": flag, "aliases": aliases, "metavar": metavar, "choices": choices, "repeat": repeat,
             "shown": shown, "skip": skip}
    out = {k: v for k, v in given.items() if v}
    if default is not dataclasses.MISSING:
        out["default"] = default
    return {"cli": out}


def check_webhook_url(url: str) -> str:
    """``url`` when it is an http(s) URL on one line; else ValueError with a one-line fix."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        raise ValueError(f"alert webhook {str(url)[:200]!r}: pass an http:// or https:// URL "
                         "(e.g. a Slack or Discord incoming-webhook URL)")
    if "@" in parts.netloc:  # never delivered (urllib sends no userinfo), and a password on the command line
        raise ValueError(f"alert webhook {parts.scheme}://{parts.hostname or ''}/…: holds a user:password@, which "
                         "is never sent; pass the URL the service gives (its secret in the path), without user:pass@")
    return url


@dataclass(kw_only=True, slots=True)
class AlertOptions:
    """What raises an alert and where it goes. Alerts are raised off the training thread, from the run's
    recorded rows (the same rules as every surface); a slow or dead webhook never slows training."""

    webhook: str | None = dataclasses.field(default=None, metadata=cli(flag="--alert-webhook", metavar="URL"))
    """POST each alert as JSON to this http(s) URL (with Slack's text and Discord's content); alerts
    (NaN loss, spike, OOM, stall, memory near the card, allocator retries, straggler, precision fallback, crash, leak)
    also go to stderr, the desktop and the run's events."""
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


def alert_items(items: list[str]) -> dict[str, Any]:
    """``--alert KEY=VALUE`` items as AlertOptions fields (a dict, as ``MonitorOptions(alerts=...)`` takes it)."""
    return parse_fields(items, AlertOptions, "--alert", "KEY")


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
    """Measure saved activations every N steps; 0: the 8 steps after the first, then gaps that double up to a cap
    set by activations_budget (a rule of step numbers: identical runs measure the same steps)."""
    activations_budget: float = 0.005
    """When activations_every is 0: the share of a long run's steps that are measured (the gaps' cap is the power
    of two at or above 1 / budget, at most 1024: 256 by default)."""
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
    eval_splits: tuple[str, ...] = ()
    """gpudash run: names of the equal, consecutive groups of batches one evaluation runs (train,val for
    nanoGPT's estimate_loss): each group's mean loss is recorded as eval_loss_NAME beside eval_loss (all)."""
    leak_poll_s: float = 5.0
    """Seconds between looks for a leak (memory held between steps growing step after step; 0: off)."""
    alerts: Any = dataclasses.field(default=None, metadata=cli(flag="--alert", repeat=alert_items))
    """Alerts during the run: AlertOptions fields as KEY=VALUE (repeatable; turns alerts on), e.g. cooldown_s=60,
    kinds=nonfinite,oom,crashed, desktop=false (from Python also True, a webhook URL or AlertOptions; None: off)."""

    def __post_init__(self) -> None:
        if self.flush_interval <= 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if self.buffer_records < 100:
            raise ValueError("buffer_records must be >= 100")
        for name in ("host_hz", "device_hz", "stacks_hz", "leak_poll_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.memory_every < 1:
            raise ValueError("memory_every must be >= 1")
        if self.activations_every < 0 or self.snapshot_every < 0:
            raise ValueError("activations_every and snapshot_every must be >= 0")
        self.eval_splits = tuple(self.eval_splits)
        bad = [n for n in self.eval_splits if not (isinstance(n, str) and n.isidentifier() and len(n) <= 32)]
        if bad or len(self.eval_splits) > 8 or len(set(self.eval_splits)) < len(self.eval_splits):
            raise ValueError(f"eval_splits must be up to 8 different names of letters, digits and _ "
                             f"(e.g. train,val), got {','.join(map(str, self.eval_splits))!r}")
        self.alerts = alert_options(self.alerts)


# ---- options from outside Python: flags, KEY=VALUE items, JSON ------------------------------------
@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each field's type of dataclass ``cls``, resolved (the modules write ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def _parts(tp: Any) -> tuple[Any, ...]:
    """``int | None`` -> (int, NoneType); a plain type -> (type,)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def describe(tp: Any) -> str:
    """How a message names a type: ``a number``, ``a whole number``, ``on or off`` ..."""
    words = []
    for part in _parts(tp):
        if part is type(None):
            continue
        origin = typing.get_origin(part)
        words.append("on or off" if part is bool else "a whole number" if part is int else "a number"
                     if part is float else "a list like 1,2,3" if origin is tuple else "KEY=VALUE items"
                     if origin is dict else "a dataclass" if dataclasses.is_dataclass(part) else "text")
    return " or ".join(dict.fromkeys(words)) or "a value"


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _one_from_text(part: Any, text: str) -> Any:
    t = text.strip()
    if part is bool:
        if t.lower() in _TRUE + _FALSE:
            return t.lower() in _TRUE
        raise ValueError
    if part is int:
        return int(t)
    if part is float:
        x = float(t)
        if not math.isfinite(x):
            raise ValueError
        return x
    if typing.get_origin(part) is tuple:
        (item, *_rest) = typing.get_args(part) or (str,)
        return tuple(_one_from_text(item, bit) for bit in t.split(",") if bit.strip())
    if part is str or part is Any or isinstance(part, type):
        return part(t) if part not in (str, Any) else t
    raise ValueError


def from_text(tp: Any, text: str) -> Any:
    """A flag's (or a ``KEY=VALUE`` item's) text as a value of type ``tp``: ``int | str`` tries int first,
    ``X | None`` reads ``none`` as None. ValueError ``expected <what>, got <text>`` when nothing fits."""
    parts = _parts(tp)
    if type(None) in parts and text.strip().lower() == "none":
        return None
    for part in sorted((p for p in parts if p is not type(None)), key=lambda p: p is str or p is Any):
        try:
            return _one_from_text(part, text)
        except (ValueError, TypeError):
            continue
    raise ValueError(f"expected {describe(tp)}, got {text!r}")


def parse_fields(items: list[str], cls: Any, flag: str, what: str = "FIELD") -> dict[str, Any]:
    """A repeatable ``KEY=VALUE`` flag's items (``["n_layer=48", "bias=true"]``) as values for fields of dataclass
    ``cls``, each read by its field's type as every flag is (:func:`from_text`). ValueError names the flag, the
    item and the valid fields, or what the value should have been."""
    types = {f.name: field_types(cls)[f.name] for f in fields(cls)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ValueError(f"{flag} {item!r}: expected {what}=VALUE with {what} one of {', '.join(types)}")
        try:
            out[key] = from_text(types[key], value)
        except ValueError as exc:
            raise ValueError(f"{flag} {item!r}: {exc}") from None
    return out


def _from_json(tp: Any, value: Any, where: str, lenient: bool) -> tuple[Any, list[str]]:
    """A JSON value (or a Python one) as type ``tp``, checked; (value, notes). ValueError when it is not."""
    for part in _parts(tp):
        if part is Any:
            return value, []
        if part is type(None) and value is None:
            return None, []
        if dataclasses.is_dataclass(part) and isinstance(part, type):
            if isinstance(value, part):
                return value, []
            if isinstance(value, Mapping):
                return load(part, value, where=where, lenient=lenient)
        if part is bool and isinstance(value, bool):
            return value, []
        if part is int and isinstance(value, int) and not isinstance(value, bool):
            return value, []
        if part is float and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value), []
        if part is str and isinstance(value, str):
            return value, []
        if typing.get_origin(part) is tuple and isinstance(value, (list, tuple)):
            (item, *_rest) = typing.get_args(part) or (Any,)
            return tuple(_from_json(item, v, where, lenient)[0] for v in value), []
        if typing.get_origin(part) is dict and isinstance(value, Mapping):
            return dict(value), []
        if isinstance(part, type) and part not in (bool, int, float, str) and isinstance(value, str):
            return part(value), []  # a Path written as text
    raise ValueError(f"{where}: {json.dumps(value, default=str)[:80]} is not {describe(tp)}")


def load(cls: type[T], data: Mapping[str, Any], *, where: str = "", rename: Mapping[str, str] | None = None,
         lenient: bool = False) -> tuple[T, list[str]]:
    """An options dataclass from a JSON dict (a config file, a run's meta, the environment), each value checked
    against its field's type; nested dataclasses from nested dicts. Returns (options, notes): a key no field
    has is left out with a note. A bad value raises ValueError naming it; ``lenient``: noted and left out
    instead (the default used), and so is a set that does not go together."""
    where = where or cls.__name__
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    tps = field_types(cls)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    notes: list[str] = []
    unknown = []
    for key, value in data.items():
        name = (rename or {}).get(key, key)
        if name not in names:
            unknown.append(key)
            continue
        try:
            kwargs[name], more = _from_json(tps[name], value, f"{where} {key}", lenient)
            notes += more
            if lenient:
                cls(**{name: kwargs[name]})  # the field's own checks, one at a time, so one bad value costs one
        except (ValueError, TypeError) as exc:
            if not lenient:
                raise ValueError(str(exc) if str(exc).startswith(where) else f"{where} {key}: {exc}") from None
            kwargs.pop(name, None)
            notes.append(str(exc) if str(exc).startswith(where) else f"{where} {key}: {exc}")
    if unknown:
        notes.append(f"{where}: left out unknown key(s) {', '.join(map(repr, unknown))} (fields: {', '.join(names)})")
    try:
        return cls(**kwargs), notes
    except (ValueError, TypeError) as exc:
        if not lenient:
            raise ValueError(f"{where}: {exc}") from None
        return cls(), [*notes, f"{where}: {exc}; using the defaults"]


def changed(opts: Any) -> dict[str, Any]:
    """The fields of options dataclass ``opts`` that differ from their defaults, as JSON values (a nested
    dataclass as its own changed fields; a tuple as a list)."""
    out: dict[str, Any] = {}
    for f in fields(opts):
        value = getattr(opts, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if value == default:
            continue
        out[f.name] = changed(value) if dataclasses.is_dataclass(value) else list(value) if isinstance(value, tuple) else value
    return out


def options_to_json(opts: MonitorOptions) -> str:
    """MonitorOptions as the text ``gpudash run`` hands its child (the fields that differ from the defaults)."""
    return json.dumps(changed(opts), sort_keys=True)


def options_from_json(text: str | None) -> tuple[MonitorOptions, str | None]:
    """The MonitorOptions :func:`options_to_json` wrote; (options, one line to say or None). Text that is not
    a JSON object, or a bad value in it (a hand-edited environment), is said and the default is used: the
    run records, never a traceback into the user's script."""
    if not text:
        return MonitorOptions(), None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return MonitorOptions(), ("the recording options gpudash run passed are not a JSON object "
                                  f"({len(text)} characters, hand-edited?); recording with the defaults")
    opts, notes = load(MonitorOptions, data, where="recording option", lenient=True)
    return opts, ("; ".join(notes) + " (the default used)") if notes else None
