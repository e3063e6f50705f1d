"""How a run ends when the script does not call ``close()``.

An uncaught exception (``sys.excepthook``), Ctrl-C, SIGTERM (only where no
handler was installed before, and only from the main thread) and interpreter
exit (``atexit``) each close the Monitor with a status and a reason, so the
run says why it ended. The previous handlers are chained and put back at close.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["ExitHandlers", "exception_status"]

#: ``close(status, reason)``: what every exit path calls.
Close = Callable[[str, str], None]


def exception_status(et: type[BaseException], ev: BaseException | None) -> tuple[str, str]:
    """The ``(status, reason)`` a run ends with when ``et`` escapes the script."""
    if issubclass(et, KeyboardInterrupt):
        return "crashed", "KeyboardInterrupt"
    return "crashed", f"exception: {et.__name__}: {ev}"


class ExitHandlers:
    """Installs the exit paths for one Monitor; :meth:`remove` puts the previous ones back."""

    def __init__(self, close: Close, *, handle_signals: bool) -> None:
        self._close = close
        self._prev_excepthook = sys.excepthook
        self._prev_sigterm: Any = None
        atexit.register(self._atexit)
        sys.excepthook = self._excepthook
        if handle_signals and threading.current_thread() is threading.main_thread():
            try:
                prev = signal.getsignal(signal.SIGTERM)
                if prev in (signal.SIG_DFL, None):
                    signal.signal(signal.SIGTERM, self._on_sigterm)
                    self._prev_sigterm = prev
            except (ValueError, OSError):
                pass

    def _excepthook(self, et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> None:
        self._close(*exception_status(et, ev))
        self._prev_excepthook(et, ev, tb)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._close("crashed", "SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _atexit(self) -> None:
        self._close("finished", "process exited without close()")

    def remove(self) -> None:
        atexit.unregister(self._atexit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
            except (ValueError, OSError):
                pass
