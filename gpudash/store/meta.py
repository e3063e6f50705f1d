"""Run facts (``run.json`` and each rank's ``meta`` table) checked on read.

Both are written by gpudash but live in files anyone can edit, copy half-way
or produce with another tool. :func:`clean_meta` gives every known key its
declared type before any surface sees it: a value of the wrong type (``"two"``
ranks, a NaN or ``1e400`` timestamp, a text flush interval) is dropped, so the
reader's default applies, and named in one line for ``Run.problems``.
Unknown keys pass through untouched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudash.store.bounded import UnsafeFile, damage, read_regular
from gpudash.store.redact import redact_meta
from gpudash.store.schema import RUN_META_FILE

__all__ = ["META_KEYS", "RUN_JSON_BYTES", "TEXT_FACT_CHARS", "clean_meta", "fit_text", "fit_text_facts", "parse_run_json",
           "read_run_json", "write_run_meta"]

_MAX_INT = 2**63 - 1
#: run.json larger than this is not read (gpudash writes a few kB).
RUN_JSON_BYTES = 8 << 20
#: Characters kept of a text fact (a run name, a host, an end reason): enough for any real one.
TEXT_FACT_CHARS = 1000
_CUT = " … "


def fit_text(text: str, limit: int = TEXT_FACT_CHARS) -> str:
    """``text`` within ``limit`` characters: a longer one keeps its start and its end with " … " between (an
    error's cause often comes last: torch's OOM message lists every process on the GPU before what this one
    holds)."""
    if len(text) <= limit:
        return text
    head = (limit - len(_CUT)) * 3 // 5
    return text[:head] + _CUT + text[len(text) - (limit - len(_CUT) - head):]


#: Timestamps after this (year 5138) are not times gpudash wrote; ``time.localtime`` chokes on them.
_MAX_TIME = 1e11


def _int_in(lo: int, hi: int) -> Callable[[Any], int | None]:
    def check(v: Any) -> int | None:
        if isinstance(v, bool):
            return None
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        return v if isinstance(v, int) and lo <= v <= hi else None

    check.__doc__ = f"a whole number from {lo} to {hi}"
    return check


def _num_in(lo: float, hi: float, *, positive: bool = False) -> Callable[[Any], float | None]:
    def check(v: Any) -> float | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, int) and not -_MAX_INT <= v <= _MAX_INT:
            return None
        f = float(v)
        ok = math.isfinite(f) and lo <= f <= hi and (f > 0 or not positive)
        return f if ok else None

    check.__doc__ = f"a {'positive ' if positive else ''}number up to {hi:g}"
    return check


def _text(v: Any) -> str | None:
    """text"""
    return v if isinstance(v, str) else None


def _bool(v: Any) -> bool | None:
    """true or false"""
    return v if isinstance(v, bool) else None


def _obj(v: Any) -> dict[str, Any] | None:
    """a JSON object"""
    return v if isinstance(v, dict) else None


def _list(v: Any) -> list[Any] | None:
    """a list"""
    return v if isinstance(v, list) else None


_TIME = _num_in(0.0, _MAX_TIME)
_BYTES = _num_in(0.0, float(2**63))


def _bytes_by_name(v: Any) -> dict[str, float] | None:
    """an object of names to byte counts"""
    if not isinstance(v, dict) or len(v) > 64:
        return None
    out = {}
    for k, n in v.items():
        size = _BYTES(n)
        if not isinstance(k, str) or size is None:
            return None
        out[k[:40]] = size
    return out


#: Known keys and their checks (the check returns the clean value, or None when wrong).
META_KEYS: dict[str, Callable[[Any], Any]] = {
    "name": _text, "run_id": _text, "status": _text, "end_reason": _text, "host": _text, "hostname": _text,
    "device": _text, "device_name": _text, "gpudash_version": _text, "python": _text, "platform": _text,
    "torch": _text, "cuda_error": _text, "imported_from": _text,
    "cuda": _text, "cuda_visible_devices": _text,
    "created_at": _TIME, "started_at": _TIME, "ended_at": _TIME, "heartbeat": _TIME,
    "flush_interval": _num_in(0.0, 86_400.0, positive=True), "publish_interval": _num_in(0.0, 86_400.0),
    "node": _text, "shared_fs": _text, "live_db": _text,
    "local_rank": _int_in(0, 1 << 24), "node_rank": _int_in(0, 1 << 24), "local_world_size": _int_in(1, 1 << 24),
    "world_size": _int_in(1, 1 << 24), "rank": _int_in(0, 1 << 24), "pid": _int_in(0, 2**31 - 1),
    "cpu_count": _int_in(1, 1 << 24), "dropped_records": _int_in(0, _MAX_INT), "total_steps": _int_in(1, _MAX_INT),
    "device_capacity_bytes": _BYTES, "memory_budget_bytes": _BYTES,
    "cuda_available": _bool,
    "argv": _list, "redacted": _list,
    "config": _obj, "estimate": _obj, "preflight": _obj, "train_summary": _obj, "trainer": _obj,
    "hf_config": _obj, "lightning_config": _obj,
    # what a step was and how the steps are numbered (gpudash run, the HF / Lightning callbacks)
    "steps_from": _text, "no_steps_reason": _text, "first_step": _int_in(0, _MAX_INT),
    "params_dtypes": _bytes_by_name,  # weight bytes by storage dtype (collectors/categories.py)
    # a resumed run (store/attempts.py): this rank's attempt, the ones before it, its newest step
    "attempt": _int_in(1, 1 << 24), "attempts": _list, "last_step": _int_in(-_MAX_INT, _MAX_INT),
}
_NULLABLE = frozenset({"cuda", "cuda_visible_devices"})


def _show(v: Any) -> str:
    """A short, always printable rendering of a bad value (huge ints and long texts cut)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _MAX_INT:
        return "a number too large to use"
    if isinstance(v, (str, bytes)) and len(v) > 40:
        v = v[:40]
    elif isinstance(v, (list, dict)) and len(v) > 8:
        return f"a {type(v).__name__} of {len(v):,} items"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def fit_text_facts(items: dict[str, Any]) -> dict[str, Any]:
    """``items`` with each text fact (a known text key, an ``unavailable_*`` note) within :data:`TEXT_FACT_CHARS`,
    as the writer stores them: what gpudash writes, its reader takes without a problem."""
    out = dict(items)
    for key, value in items.items():
        if isinstance(value, str) and len(value) > TEXT_FACT_CHARS and (
                META_KEYS.get(key) is _text or key.startswith("unavailable_")):
            out[key] = fit_text(value)
    return out


def clean_meta(meta: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """A copy of ``meta`` whose known keys hold their declared types; each dropped
    value is named in ``problems`` as ``WHERE: KEY is VALUE (expected ...); ignored``."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        check = META_KEYS.get(key)
        if key.startswith("unavailable_"):
            check = _text
        if check is None or (value is None and key in _NULLABLE):
            out[key] = value
            continue
        clean = check(value)
        if clean is None:
            msg = f"{where}: {key} is {_show(value)} (expected {check.__doc__}); ignored"
            if msg not in problems:
                problems.append(msg)
            continue
        if isinstance(clean, str) and len(clean) > TEXT_FACT_CHARS:
            msg = f"{where}: {key} is {len(clean):,} characters long; trimmed to {TEXT_FACT_CHARS:,}"
            if msg not in problems:
                problems.append(msg)
            clean = fit_text(clean)
        out[key] = clean
    # a run recorded before secrets were redacted on write (or by another tool) shows none either
    return redact_meta(out)


def read_run_json(run_dir: Path, problems: list[str]) -> dict[str, Any]:
    """A run's ``run.json`` as checked facts (:func:`gpudash.store.meta.clean_meta`); ``{}`` when it is
    missing, not a regular file, over :data:`RUN_JSON_BYTES` or not a JSON object (said in ``problems``)."""

    def say(msg: str) -> dict[str, Any]:
        if msg not in problems:
            problems.append(msg)
        return {}

    try:
        raw = read_regular(Path(run_dir) / RUN_META_FILE, RUN_JSON_BYTES)
    except FileNotFoundError:
        return {}
    except UnsafeFile as exc:
        return say(f"{RUN_META_FILE}: {exc}; using the per-rank meta")
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        return say(f"{RUN_META_FILE}: unreadable ({type(exc).__name__}: {damage(exc)[:200]}); using the per-rank meta")
    return parse_run_json(raw, problems)


def parse_run_json(raw: bytes, problems: list[str]) -> dict[str, Any]:
    """``run.json``'s bytes as checked facts (:func:`read_run_json`, for bytes already read: a run listed
    from an object store)."""

    def say(msg: str) -> dict[str, Any]:
        if msg not in problems:
            problems.append(msg)
        return {}

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError, MemoryError) as exc:
        return say(f"{RUN_META_FILE}: unreadable ({type(exc).__name__}: {damage(exc)[:200]}); using the per-rank meta")
    if not isinstance(data, dict):
        return say(f"{RUN_META_FILE}: holds a {type(data).__name__}, not a JSON object; using the per-rank meta")
    return clean_meta(data, RUN_META_FILE, problems)


def write_run_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``run.json`` atomically (tmp file + rename) if it does not exist yet (the first rank to start
    writes it; nothing that looks like a credential is recorded)."""
    from gpudash.store.atomic import write_atomic

    path = run_dir / RUN_META_FILE
    if path.exists():
        return
    write_atomic(path, json.dumps(redact_meta(meta), indent=1, default=str), exclusive=True)  # across ranks
