"""Command-line flags made from options dataclasses (``TrainConfig``, ``MonitorOptions``), and the one set of
server flags (``serve``, ``demo``, ``run --serve``).

A field becomes ``--field-name``: its docstring is the help line, its default the default (said in the
help; the flag is left out of the namespace when not given, so the dataclass's own default applies), its
type reads the text (:func:`gpudash.options.from_text`; a bool is ``--x/--no-x``), and
``metadata=gpudash.options.cli(...)`` says the rest (another name, choices, a repeatable ``KEY=VALUE``
flag, the command line's own default, no flag). A bad value is one line naming the flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable
from functools import cache
from typing import Any

from gpudash.errors import UserError
from gpudash.options import DEFAULT_PORT, field_types, from_text

__all__ = ["add_alert_arguments", "add_fields", "add_server_arguments", "alerts_from_args", "field_docs", "fields_from_args", "flag_of", "flags_error",
           "nonnegative_float", "positive_float", "positive_int"]


# ---- numbers that must be in range (estimate and others' own flags) ---------------------------------
def positive_int(text: str) -> int:
    """A flag that counts something (steps, tokens, samples): a whole number >= 1. 0 is refused
    rather than read as "the default", which is what leaving the flag out gives."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n} (leave the flag out for the default)")
    return n


def _float(text: str) -> float:
    try:
        return float(from_text(float, text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None


def positive_float(text: str) -> float:
    """A size or rate (GB, TFLOP/s): a finite number > 0."""
    x = _float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text} (leave the flag out for the default)")
    return x


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (0: off, as the flag's help says)."""
    x = _float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return x


# ---- flags from a dataclass's fields -----------------------------------------------------------------
@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls`` (PEP 257 attribute docstrings), read
    once from its source; one line each, whitespace folded."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _meta(f: dataclasses.Field[Any]) -> dict[str, Any]:
    return dict(f.metadata.get("cli", {}))


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The flag a field is on the command line: ``--field-name`` unless its metadata names another."""
    return str(_meta(f).get("flag") or "--" + f.name.replace("_", "-"))


def _default_text(f: dataclasses.Field[Any], meta: dict[str, Any]) -> str | None:
    if meta.get("shown"):
        return str(meta["shown"])
    value = meta.get("default", f.default)
    if value is dataclasses.MISSING or value is None or value in ((), "", {}):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _reader(tp: Any, flag: str) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            return from_text(tp, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = flag  # what argparse says if anything else goes wrong
    return read


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}.{name}"


def add_fields(p: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, prefix: str,
               skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> None:
    """A flag for each field of dataclass ``cls`` (but those in ``skip`` or not in ``only``, or whose metadata
    says ``skip``); the values given land in ``args`` under ``<prefix>.<field>`` (see :func:`fields_from_args`)."""
    docs = field_docs(cls)
    types = field_types(cls)
    for f in dataclasses.fields(cls):
        meta = _meta(f)
        if f.name in skip or (only is not None and f.name not in only) or meta.get("skip"):
            continue
        tp, flag = types[f.name], flag_of(f)
        names = [flag, *meta.get("aliases", ())]
        default = _default_text(f, meta)
        text = _as_flags(docs.get(f.name, "").rstrip("."), cls)
        if default is not None and tp is not bool and not (default == "0" and "0:" in text):
            text += f" (default: {default})"
        kw: dict[str, Any] = {"dest": _dest(prefix, f.name), "default": argparse.SUPPRESS,
                              "help": text.replace("%", "%%")}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
            kw["help"] += f" (default: {default})"
        elif meta.get("repeat"):
            kw.update(action="append", metavar=meta.get("metavar", "KEY=VALUE"))
        else:
            kw.update(type=_reader(tp, flag), metavar=meta.get("metavar") or _metavar(f.name, tp))
            if meta.get("choices"):
                kw.update(choices=meta["choices"], metavar=None)
        p.add_argument(*names, **kw)


_UNITS = {"gb": "GB", "hz": "HZ", "ms": "MS", "s": "SECONDS", "pct": "PCT"}


def _metavar(name: str, tp: Any) -> str:
    unit = _UNITS.get(name.rsplit("_", 1)[-1]) if "_" in name else None
    return unit or ("N" if tp is int else "X" if tp is float else name.upper())


def _as_flags(text: str, cls: type) -> str:
    """``text`` with the fields of ``cls`` it names (``seq_len``) named as their flags (``--seq-len``)."""
    for f in dataclasses.fields(cls):
        if "_" in f.name:  # one-word names are words too ("device", "name"): messages say --x already
            text = re.sub(rf"(?<![\w-]){re.escape(f.name)}(?![\w])", flag_of(f), text)
    return text


def fields_from_args(args: argparse.Namespace, cls: type, prefix: str,
                     only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The fields of ``cls`` (those in ``only``, when given) the command line gave (and the command line's own
    defaults, where a field's metadata has one), ready for ``cls(**...)``. ValueError from a repeatable flag's
    reader names it."""
    given = vars(args)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        meta = _meta(f)
        dest = _dest(prefix, f.name)
        if dest in given:
            value = given[dest]
            out[f.name] = meta["repeat"](value) if meta.get("repeat") else value
        elif "default" in meta:
            out[f.name] = meta["default"]() if callable(meta["default"]) else meta["default"]
    return out


def flags_error(exc: Exception, *classes: type) -> UserError:
    """A dataclass's ValueError as the command line's one line: the fields it names (``memory_every``) are
    named as their flags (``--memory-every``)."""
    text = str(exc)
    for cls in classes:
        text = _as_flags(text, cls)
    return UserError(text)


# ---- the alert flags of run, train and serve -----------------------------------------------------------
def add_alert_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--alert-webhook URL`` (``AlertOptions.webhook``) and ``--alert KEY=VALUE`` (``MonitorOptions.alerts``,
    any AlertOptions field), made from the fields as every other flag; the same on ``run``, ``train`` and
    ``serve`` (which alerts on every live run it serves)."""
    from gpudash.options import AlertOptions, MonitorOptions

    add_fields(p, AlertOptions, "alert", only=("webhook",))
    add_fields(p, MonitorOptions, "monitor", only=("alerts",))


def alerts_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The AlertOptions fields the alert flags ask for, checked now (every mistake one line before the run, not
    mid-run), as a JSON-able dict (what ``MonitorOptions(alerts=...)`` takes and ``gpudash run`` hands its child);
    None when no alert flag was given. Raises ValueError naming the flag."""
    from gpudash.options import AlertOptions, MonitorOptions, alert_options

    items = fields_from_args(args, MonitorOptions, "monitor", only=("alerts",)).get("alerts")
    webhook = fields_from_args(args, AlertOptions, "alert", only=("webhook",))
    if items is None and not webhook:
        return None
    out = {**(items or {}), **webhook}
    alert_options(out)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


# ---- the server's flags ------------------------------------------------------------------------------
def add_server_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, what: str = "the dashboard",
                         busy: str = "") -> None:
    """``--host``, ``--port``, ``--token`` and ``--allow-host``, the same on every command that serves the
    dashboard (``serve``, ``demo``, ``run --serve``); ``busy`` says what a taken port does."""
    from gpudash.server.access import TOKEN_ENV

    p.add_argument("--host", default="127.0.0.1",
                   help=f"address {what} binds (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"port of {what} (default: {DEFAULT_PORT}{'; ' + busy if busy else ''})")
    p.add_argument("--token", default=None,
                   help=f"require this token on every page and API call (default: ${TOKEN_ENV}); "
                        "needed to bind anything but loopback")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests addressed to NAME (a DNS name or proxy in front of the server); "
                        "'*' answers any (default: loopback names and the bound address only)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"{port}: pick a port between 1 and 65535 (0: any free port)")
    return port
