"""The live dashboard inline in Jupyter, while the same kernel keeps training.

    monitor = gpudash.Monitor("runs/exp1")
    monitor.show()            # or gpudash.show("runs/exp1")
    for batch in loader: ...  # the dashboard above keeps updating

The dashboard server runs on a daemon thread of the kernel, bound to
loopback only. One server per runs folder: calling ``show`` again (for the
same run or another run in the same folder) reuses it. The server outlives
the Monitor, so a finished run stays viewable as a replay.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

__all__ = ["dashboard_url", "show", "shutdown"]

_HOST = "127.0.0.1"
_servers: dict[Path, tuple[str, Callable[[], None]]] = {}
_lock = threading.Lock()


def dashboard_url(run_dir: str | os.PathLike[str], *, port: int | None = None) -> str:
    """Start (once per runs folder) the dashboard on loopback and return the run page's URL.

    The runs folder is ``run_dir``'s parent, so the run's id is its folder name.
    ``port`` is used only when a server is started (None: a free port)."""
    run_path = Path(run_dir).resolve()
    runs_dir = run_path.parent
    with _lock:
        entry = _servers.get(runs_dir)
        if entry is None:
            from gpudash.app import serve_in_thread

            url, stop = serve_in_thread(runs_dir, _HOST, port or 0)
            entry = _servers[runs_dir] = (url.rstrip("/"), stop)
    return f"{entry[0]}/run/{quote(run_path.name)}"


def show(run_dir: str | os.PathLike[str], *, height: int = 720, port: int | None = None) -> str:
    """Display the live dashboard of ``run_dir`` inline (an IFrame) and return its URL.

    Outside IPython it prints the URL instead, for a browser on this machine."""
    url = dashboard_url(run_dir, port=port)
    try:
        from IPython import get_ipython
        from IPython.display import IFrame, display
    except ImportError:
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is None or get_ipython() is None:
        print(f"gpudash dashboard: {url}")
        return url
    display(IFrame(url, width="100%", height=height))
    return url


def shutdown() -> None:
    """Stop every dashboard server this process started (they are daemon threads;
    a kernel restart stops them too)."""
    with _lock:
        entries = list(_servers.values())
        _servers.clear()
    for _, stop in entries:
        stop()
