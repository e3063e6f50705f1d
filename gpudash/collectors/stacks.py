"""Where Python time goes: py-spy samples this process, folded stacks go to ``stacks``.

Off by default (``stacks_hz=0``). When on, a daemon thread runs ``py-spy
record --pid <this> --format raw --rate R --nonblocking -d W -o <tmp>`` one
window of ``W`` seconds after another (``--nonblocking``: the training
process is never paused), parses the folded stacks (``f1;f2;f3 count``, root
first) and writes one row per distinct stack per window: ``time`` (window
end), ``stack``, ``count``. Memory and disk stay bounded: one window's temp
file at a time (deleted after parsing), at most ``max_stacks`` stacks per
window (the rest summed into ``(other stacks)``), stacks longer than
``max_stack_chars`` keep their innermost frames.

Attaching needs ptrace rights. Where Yama's ptrace_scope is 1 (a process may
only trace its descendants, and py-spy is our child tracing its parent) the
collector calls ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`` while it runs,
which lets processes of the same user attach. Where ptrace is refused (containers without CAP_SYS_PTRACE, scope >= 2)
the reason py-spy gives is recorded once as "not available" and training goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["OTHER", "StackCollector", "aggregate_stacks", "find_py_spy", "parse_folded", "allow_ptrace"]

OTHER = "(other stacks)"
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")


def find_py_spy() -> str | None:
    """py-spy on PATH, else next to this interpreter (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    cand = Path(sys.executable).parent / ("py-spy.exe" if os.name == "nt" else "py-spy")
    return str(cand) if cand.exists() else None


def allow_ptrace(enable: bool = True) -> str:
    """Let other processes of this user (py-spy) attach where Yama restricts ptrace.
    Returns what was done, for the run's meta."""
    if not sys.platform.startswith("linux"):
        return "not linux"
    try:
        scope = int(_YAMA.read_text().strip())
    except (OSError, ValueError):
        return "no yama"
    if scope != 1:
        return f"yama ptrace_scope={scope}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        arg = _PR_SET_PTRACER_ANY if enable else 0
        rc = libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    except (OSError, AttributeError) as exc:
        return f"prctl failed: {exc}"
    return "PR_SET_PTRACER_ANY" if rc == 0 and enable else f"prctl rc={rc}"


def parse_folded(text: str) -> Counter[str]:
    """``"a;b;c 12"`` lines -> Counter({"a;b;c": 12}); malformed lines are skipped."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        stack, sep, count = line.rstrip().rpartition(" ")
        if not sep or not stack or not count.isdigit():
            continue
        out[stack] += int(count)
    return out


def _shorten(stack: str, max_chars: int) -> str:
    if len(stack) <= max_chars:
        return stack
    frames = stack.split(";")
    kept: list[str] = []
    size = 2
    for fr in reversed(frames):
        if size + len(fr) + 1 > max_chars:
            break
        kept.append(fr)
        size += len(fr) + 1
    return "…;" + ";".join(reversed(kept))


def aggregate_stacks(counts: Counter[str], max_stacks: int, max_stack_chars: int) -> list[tuple[str, int]]:
    """The ``max_stacks`` most frequent stacks (shortened), the rest summed as ``OTHER``."""
    merged: Counter[str] = Counter()
    for stack, n in counts.items():
        merged[_shorten(stack, max_stack_chars)] += n
    top = merged.most_common(max_stacks)
    rest = sum(merged.values()) - sum(n for _, n in top)
    if rest:
        top.append((OTHER, rest))
    return top


class StackCollector:
    name = "stacks"

    def __init__(self, hz: float = 10.0, *, window_s: float = 5.0, max_stacks: int = 500,
                 max_stack_chars: int = 4000, pid: int | None = None, py_spy: str | None = None) -> None:
        if hz <= 0:
            raise ValueError("stacks hz must be > 0")
        self.hz = hz
        self.window_s = window_s
        self.max_stacks = max_stacks
        self.max_stack_chars = max_stack_chars
        self.pid = os.getpid() if pid is None else pid
        self.py_spy = py_spy
        self.windows = 0
        self.samples = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._monitor: Recording | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def start(self, monitor: Recording) -> None:
        exe = self.py_spy or find_py_spy()
        if exe is None or not (shutil.which(exe) or Path(exe).is_file()):
            monitor.unavailable(self.name, f"py-spy is not installed ({exe or 'not on PATH'}; pip install py-spy)")
            return
        self.py_spy = exe
        self._monitor = monitor
        monitor.set_meta(stacks_ptrace=allow_ptrace(True), stacks_hz=self.hz)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpudash-stacks-")
        self._thread = threading.Thread(target=self._run, name="gpudash-stacks", daemon=True)
        self._thread.start()

    def _command(self, out: Path, seconds: float) -> list[str]:
        assert self.py_spy is not None
        return [self.py_spy, "record", "--pid", str(self.pid), "--format", "raw", "--rate",
                str(max(1, round(self.hz))), "--nonblocking", "--duration", str(max(1, round(seconds))),
                "-o", str(out)]

    def _window(self, out: Path) -> tuple[int, str]:
        try:
            proc = subprocess.Popen(self._command(out, self.window_s), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            return -1, f"error: cannot run py-spy: {exc}"
        self._proc = proc
        if self._stop.is_set():  # stop() came while this window was starting
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate()
        finally:
            self._proc = None
        return proc.returncode, err.decode(errors="replace")

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - never kill the sampler silently
            if self._monitor is not None:
                self._monitor.unavailable(self.name, f"stopped after an error: {type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        monitor = self._monitor
        assert monitor is not None and self._tmp is not None
        out = Path(self._tmp.name) / "window.txt"
        retried = False
        while not self._stop.is_set():
            out.unlink(missing_ok=True)
            rc, err = self._window(out)
            counts = Counter[str]()
            with contextlib.suppress(OSError):
                counts = parse_folded(out.read_text(errors="replace"))
            out.unlink(missing_ok=True)
            if counts:
                t = time.time()
                for stack, n in aggregate_stacks(counts, self.max_stacks, self.max_stack_chars):
                    monitor.put("stacks", {"time": t, "stack": stack, "count": n})
                self.windows += 1
                self.samples += sum(counts.values())
                continue
            if self._stop.is_set():
                return
            if rc != 0 and self.windows == 0:
                reason = _reason(err)
                if "python version" in reason.lower() and not retried:
                    retried = True  # a just-started interpreter is not readable yet
                    self._stop.wait(1.0)
                    continue
                monitor.unavailable(self.name, f"py-spy could not sample this process: {reason}")
                return
            if rc != 0:
                monitor.unavailable(self.name, f"py-spy stopped: {_reason(err)}")
                return

    def stop(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive() and self._proc is not None:
                with contextlib.suppress(OSError):
                    self._proc.kill()
                self._thread.join(2)
            self._thread = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None
        if self._monitor is not None:
            allow_ptrace(False)
            self._monitor = None

    def status(self) -> dict[str, Any]:
        return {"windows": self.windows, "samples": self.samples}


def _reason(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith("error") or "permission" in ln.lower():
            return ln[:300]
    return (lines[0][:300] if lines else "no output")
