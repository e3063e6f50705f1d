"""Values a training loop logs, as SQLite stores them.

The writer thread turns every cell through :func:`cell`: plain numbers and
ASCII text return at once; anything else is converted (tensors and numpy
scalars to numbers, containers to JSON, an integer beyond 64 bits to a float,
a non-UTF-8 string escaped) or, when no form exists, raises
:class:`Unstorable` so the writer leaves the cell empty and counts it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Unstorable", "cell", "num", "sql_type", "storable", "to_plain"]

_INT64 = 1 << 63


class Unstorable(Exception):
    """A value that SQLite cannot store in any form (the message says why)."""


def to_plain(value: Any) -> Any:
    """Turn tensors and numpy scalars into plain Python values (off the hot path). Never raises:
    what cannot be converted becomes ``None``."""
    if value is None or isinstance(value, (int, float, str, bytes, dict, list)):
        return value
    try:
        return _plain(value)
    except Unstorable:
        return None


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if item is not None:
        try:
            n = getattr(value, "numel", None) or getattr(value, "size", 1)
            n = n() if callable(n) else n
            if n == 1:
                return item()
        except Exception as exc:  # noqa: BLE001 - a broken tensor must not stop the writer
            raise Unstorable(f"{type(value).__name__}.item() failed: {exc}") from None
        raise Unstorable(f"a {type(value).__name__} of {n} values; log one number (e.g. .mean())")
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - any object: store its text
        try:
            return str(value)
        except Exception as exc:  # noqa: BLE001
            raise Unstorable(f"{type(value).__name__} has no number or text form ({exc})") from None


def storable(value: Any) -> Any:
    """Slow path of :func:`cell`: any value as something SQLite stores, or :class:`Unstorable`."""
    try:
        if isinstance(value, (dict, list, tuple)):
            return json.dumps(value, default=str)
        if not isinstance(value, (bool, int, float, str, bytes, bytearray, memoryview)):
            value = _plain(value)
            if isinstance(value, (dict, list)):
                return json.dumps(value, default=str)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            value = int(value)
            if -_INT64 <= value < _INT64:
                return value
            try:
                return float(value)  # beyond 64 bits: a float keeps the magnitude
            except OverflowError:
                raise Unstorable(f"an integer of {value.bit_length()} bits is beyond any float") from None
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            value = str(value)
            try:
                value.encode("utf-8")
                return value
            except UnicodeEncodeError:  # lone surrogates: SQLite wants UTF-8
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if value is None:
            return None
        return float(value)  # e.g. numpy longdouble from .item()
    except Unstorable:
        raise
    except Exception as exc:  # noqa: BLE001 - any value, any failure: say which
        raise Unstorable(f"{type(value).__name__}: {type(exc).__name__}: {exc}") from None


def sql_type(value: Any) -> str:
    try:
        value = cell(value)
    except Unstorable:
        return "REAL"
    if isinstance(value, str):
        return "TEXT"
    if isinstance(value, (bytes, bytearray)):
        return "BLOB"
    return "REAL"


def num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def cell(value: Any) -> Any:
    """A value as SQLite stores it (hot loop of the writer: plain values return at once)."""
    cls = value.__class__
    if cls is float or value is None or cls is bytes:
        return value
    if cls is int:
        if -_INT64 <= value < _INT64:
            return value
    elif cls is str and value.isascii():
        return value
    return storable(value)
