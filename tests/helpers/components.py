"""Reading a built Dash page in a test (no browser): a component by id, a component's text, a free port."""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["find", "free_port", "text"]


def _children(component: Any) -> list[Any]:
    kids = getattr(component, "children", None)
    return list(kids) if isinstance(kids, list | tuple) else [kids] if kids is not None else []


def find(component: Any, cid: str) -> Any:
    """The first component with id ``cid`` in the tree under ``component`` (depth first), else None."""
    if getattr(component, "id", None) == cid:
        return component
    for child in _children(component):
        hit = find(child, cid)
        if hit is not None:
            return hit
    return None


def text(component: Any) -> str:
    """The text a component shows: its string children, joined, all the way down."""
    if isinstance(component, str):
        return component
    kids = getattr(component, "children", None)
    if isinstance(kids, list | tuple):
        return "".join(text(c) for c in kids)
    return "" if kids is None else text(kids)


def free_port() -> int:
    """A loopback port nothing listens on now (for a server a test starts in another process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
