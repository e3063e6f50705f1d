"""Secrets are never recorded: what a run stores of its command line, config and environment is redacted.

A run folder travels (shared folders, buckets, the dashboard's API answers anyone who opens it), so
nothing that looks like a credential is written into ``run.json`` or a rank's ``meta`` table:

* a value given to a flag, key or environment variable whose name says credential (``--alert-webhook``,
  ``--hf-token``, ``api_key``, ``AWS_SECRET_ACCESS_KEY=...``, ``password``, ``auth``, ...);
* a URL that carries a credential (``user:pass@``, a webhook host such as ``hooks.slack.com``, a query
  parameter named like one: ``?token=``, ``X-Amz-Signature=``), wherever it appears in a text;
* a token of a well-known shape (``ghp_...``, ``xoxb-...``, ``hf_...``, ``sk-...``, ``AKIA...``, a JWT).

A URL keeps its scheme and host (``https://hooks.slack.com/…``, enough to tell which service it was);
any other value becomes ``…``. What was redacted is said in the meta key ``redacted`` (one line each),
so a reader knows the value existed and why it is not shown.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["REDACTED", "redact_meta", "redact_text", "secret_name"]

#: What a redacted value (that is not a URL) becomes.
REDACTED = "…"
#: Depth beyond which a config is not walked (its deeper values are dropped whole: nothing is kept unread).
_MAX_DEPTH = 32

_WORDS = frozenset({"token", "secret", "secrets", "password", "passwd", "pwd", "passphrase", "apikey", "credential",
                    "credentials", "webhook", "auth", "authorization", "cookie", "dsn", "bearer", "privatekey",
                    "accesskey", "secretkey", "clientsecret"})
_KEY_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                        ("account", "key"), ("client", "secret"), ("session", "key"), ("signing", "key")})
#: A last name part that makes a name about a credential rather than one (counts, errors, where it is kept).
_ABOUT = frozenset({"sent", "dropped", "error", "errors", "count", "counts", "limit", "budget", "file", "path",
                    "kind", "type", "size", "timeout", "retries", "env", "var", "enabled"})
_SPLIT = re.compile(r"[^a-z0-9]+")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,20}://[^\s\"'<>]+")
_WEBHOOK_HOSTS = ("hooks.slack.com", "discord.com", "discordapp.com", "webhook.office.com", "outlook.office.com",
                  "hooks.zapier.com", "api.telegram.org", "chat.googleapis.com", "events.pagerduty.com",
                  "api.opsgenie.com", "webhook.site")
_TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+)")


def secret_name(name: str) -> bool:
    """Whether a flag, key or variable name says its value is a credential (``--alert-webhook``,
    ``HF_TOKEN``, ``api_key``, ``secretAccessKey``; not ``max_tokens`` or ``tokenizer``)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)  # camelCase -> camel_case
    parts = [p for p in _SPLIT.split(spaced.lower()) if p]
    if len(parts) > 1 and parts[-1] in _ABOUT:  # webhook_sent, webhook_last_error, token_file: about it, not it
        return False
    if any(p in _WORDS for p in parts):
        return True
    return any(pair in _KEY_PAIRS for pair in zip(parts, parts[1:], strict=False))


def _short_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return REDACTED
    return f"{parts.scheme}://{host}{port}/{REDACTED}" if host else REDACTED


def _secret_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        query = parse_qsl(parts.query, keep_blank_values=True)
        has_userinfo = "@" in parts.netloc
    except ValueError:
        return True  # not even parseable: not kept
    if has_userinfo:
        return True
    if any(host == h or host.endswith("." + h) for h in _WEBHOOK_HOSTS):
        return True
    if "/webhook" in parts.path.lower() or "/hooks/" in parts.path.lower():
        return True
    return any(secret_name(k) or k.lower() in ("sig", "signature", "key", "code") for k, _ in query)


def redact_text(text: str) -> tuple[str, bool]:
    """``text`` with every credential-carrying URL cut to its scheme and host and every token of a known
    shape replaced; (text, whether anything was cut)."""
    hit = False

    def url(m: re.Match[str]) -> str:
        nonlocal hit
        if _secret_url(m.group(0)):
            hit = True
            return _short_url(m.group(0))
        return m.group(0)

    def token(m: re.Match[str]) -> str:
        nonlocal hit
        hit = True
        return REDACTED

    out = _TOKEN.sub(token, _URL.sub(url, text))
    return out, hit


_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


def _value(v: str) -> str:
    """A whole value given under a secret name: a URL keeps scheme and host, a plain number stays
    (``--max-token-count 5``), anything else goes."""
    v = v.strip()
    if _NUMBER.fullmatch(v):
        return v
    return _short_url(v) if _URL.fullmatch(v) else REDACTED


def _argv(argv: list[Any], notes: list[str]) -> list[Any]:
    out: list[Any] = []
    secret_next: str | None = None
    for i, raw in enumerate(argv):
        if not isinstance(raw, str):
            out.append(raw)
            continue
        if secret_next is not None and not (raw.startswith("-") and len(raw) > 1 and not raw[1].isdigit()):
            out.append(_value(raw))
            if out[-1] != raw:
                notes.append(f"argv: the value of {secret_next[:60]}")
            secret_next = None
            continue
        secret_next = None
        if raw.startswith("-") and "=" in raw:
            flag, value = raw.split("=", 1)
            if secret_name(flag) and value and _value(value) != value:
                out.append(f"{flag}={_value(value)}")
                notes.append(f"argv: the value of {flag[:60]}")
                continue
        elif raw.startswith("-") and secret_name(raw):
            secret_next = raw
            out.append(raw)
            continue
        elif not raw.startswith("-") and "=" in raw:  # VAR=value (an environment assignment)
            name, value = raw.split("=", 1)
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and secret_name(name) and value \
                    and _value(value) != value:
                out.append(f"{name}={_value(value)}")
                notes.append(f"argv: the value of {name[:60]}")
                continue
        text, hit = redact_text(raw)
        if hit:
            notes.append(f"argv[{i}]: a credential in the text")
        out.append(text)
    return out


def _walk(value: Any, where: str, notes: list[str], depth: int) -> Any:
    if isinstance(value, str):
        text, hit = redact_text(value)
        if hit:
            notes.append(f"{where}: a credential in the text")
        return text
    if depth > _MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        notes.append(f"{where}: nested over {_MAX_DEPTH} levels; not recorded")
        return REDACTED
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            here = f"{where}.{k}" if where else str(k)
            if isinstance(k, str) and secret_name(k) and v not in (None, "", False, True) \
                    and not isinstance(v, (int, float)):
                out[k] = _value(v) if isinstance(v, str) else REDACTED
                notes.append(f"{here[:120]}: named like a credential")
            elif isinstance(k, str) and k.lower() in ("alerts", "alert") and isinstance(v, str) and "://" in v:
                out[k] = _value(v)  # Monitor(alerts=URL): the webhook
                notes.append(f"{here[:120]}: a webhook URL")
            elif k == "argv" and isinstance(v, list):
                out[k] = _argv(v, notes)
            else:
                out[k] = _walk(v, here, notes, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_walk(v, f"{where}[{i}]", notes, depth + 1) for i, v in enumerate(value)]
    return value


def redact_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``meta`` (``run.json`` or a rank's meta) with every credential redacted (see the module
    doc); when anything was, ``redacted`` lists where, one line each."""
    notes: list[str] = []
    out = _walk(meta, "", notes, 0)
    assert isinstance(out, dict)
    if notes:
        seen = list(dict.fromkeys(notes))[:50]
        prior = out.get("redacted")
        out["redacted"] = [*(prior if isinstance(prior, list) else []), *seen]
    return out
