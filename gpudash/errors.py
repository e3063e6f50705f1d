"""Errors a user can cause; the CLI prints them as one line, without a traceback.

This module imports nothing from gpudash, so every layer (store, collectors,
monitor, dashboard, CLI) can raise and catch these.
"""

from __future__ import annotations

__all__ = ["RunError", "UserError"]


class UserError(Exception):
    """A bad flag, path or config. The message names the problem and the fix."""


class RunError(Exception):
    """A run directory (or snapshot file) that cannot be read or written at all; the message names the fix."""
