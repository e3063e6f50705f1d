"""The README's demo command, as a newcomer runs it (short)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import gpudash


def test_demo_trains_and_serves_and_says_which_port_it_chose(tmp_path: Path) -> None:
    with socket.socket() as busy:  # the port asked for is taken: the demo serves on another and says so
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "gpudash", "demo", "--steps", "3", "--exit", "--port", str(port),
                              "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    chosen = re.search(rf"port {port} is busy; dashboard on http://127\.0\.0\.1:(\d+)/", out.stdout)
    assert chosen and int(chosen.group(1)) != port, out.stdout
    assert re.search(rf"dashboard at http://127\.0\.0\.1:{chosen.group(1)}/", out.stdout)
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1
    run = gpudash.load_run(runs[0])
    assert run.status == "finished" and len(run.steps) == 3


def test_demo_bad_flag_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "gpudash", "demo", "--steps", "0"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--steps" in out.stderr
