"""Errors a user can cause; the CLI prints them as one line, without a traceback."""

from __future__ import annotations

from gpudash.store.reader import RunError

__all__ = ["RunError", "UserError"]


class UserError(Exception):
    """A bad flag, path or config. The message names the problem and the fix."""
