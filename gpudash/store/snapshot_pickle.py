"""Reading a torch allocator snapshot pickle safely: nothing in it runs, and it cannot make gigabytes.

A pickle is code: :func:`read_snapshot_pickle` uses an unpickler that refuses every global, so a
hostile file fails with a one-line :class:`RunError` and nothing in it runs. The bytes reach the C
unpickler a MiB at a time and the memory made so far is checked before each chunk
(:data:`GROWTH_PER_BYTE` per byte read): a 17 MB pickle of empty lists stops after a few MB, while a real
snapshot (5-10x its file) is read whole. :func:`open_snapshot_file` refuses pipes and devices without
blocking on them; :func:`no_gc` pauses the cyclic collector while tens of millions of containers are made.
No torch here.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from gpudash.errors import RunError
from gpudash.units import human_bytes

__all__ = ["GROWTH_PER_BYTE", "GROWTH_SLACK", "no_gc", "open_snapshot_file", "read_snapshot_pickle"]


# ---- reading a pickle safely ----------------------------------------------------------------
class _NoGlobals(pickle.Unpickler):
    """Plain containers only: every global (and so every call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id")


#: Memory the unpickled objects may take per byte of pickle read so far (and :data:`GROWTH_SLACK` on top).
#: A real snapshot takes 5-10x its file (frame dicts shared, as torch writes them); a pickle of empty
#: lists takes ~40x (two bytes make a 72-byte list), so counting while reading stops it early.
GROWTH_PER_BYTE = 32
GROWTH_SLACK = 96 * 2**20
#: Bytes read between two looks at the process's memory.
_CHUNK = 1 << 20


class _OverMemory(Exception):
    pass


def _rss_reader() -> Callable[[], int] | None:
    """The process's resident bytes from /proc (Linux), else None (then the object count is used)."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm", "rb") as f:
            int(f.read().split()[1])
    except (OSError, ValueError, IndexError, AttributeError):
        return None

    def rss() -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * page

    return rss


def _blocks_bytes() -> int:
    """Python's small objects alive, as bytes (64 a block): what a pickle of many small containers makes. It
    grows with them even where the resident size does not (a process that freed more than the pickle makes
    reuses its pages: a test worker after a big test read an 8 MB pickle of empty lists whole by /proc)."""
    return sys.getallocatedblocks() * 64


class _Metered(io.RawIOBase):
    """The pickle's bytes, handed to the C unpickler a chunk at a time; before each chunk the memory grown since
    the start is checked against what the bytes read so far may make (:data:`GROWTH_PER_BYTE`)."""

    def __init__(self, src: Any, per_byte: int, slack: int) -> None:
        self.src = src
        self.read_bytes = 0
        self.per_byte = per_byte
        self.slack = slack
        self.rss = _rss_reader()  # big objects (bytes, strings past 512 B) leave Python's blocks: both are looked at
        self.base = (self.rss() if self.rss else 0, _blocks_bytes())
        self.peak_growth = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        grown = max(self.rss() - self.base[0] if self.rss else 0, _blocks_bytes() - self.base[1])
        self.peak_growth = max(self.peak_growth, grown)
        if grown > self.per_byte * self.read_bytes + self.slack:
            raise _OverMemory(f"{human_bytes(grown)} made from its first {human_bytes(self.read_bytes)}")
        n = int(self.src.readinto(b))
        self.read_bytes += n
        return n


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused (as it was, after): unpickling a snapshot makes tens of millions
    of containers, and each collection on the way walks all made so far (2.7x slower with it on). A torch
    snapshot has no cycles; drop it inside the block, so the collector never walks it at all."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def open_snapshot_file(path: str | os.PathLike[str]) -> tuple[BinaryIO, int]:
    """``path`` opened for reading and its size; RunError naming the fix for a missing file, a directory, a
    pipe or device (opened without blocking, then refused: reading one would wait forever) or no permission."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise RunError(f"{path}: no such snapshot file (write one with torch.cuda.memory._dump_snapshot)") from None
    except IsADirectoryError:
        raise RunError(f"{path}: is a directory; pass the snapshot .pickle file") from None
    except OSError as exc:
        raise RunError(f"{path}: unreadable ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe or device)"
        raise RunError(f"{path}: is {kind}; pass the snapshot .pickle file")
    return os.fdopen(fd, "rb", buffering=0), int(st.st_size)


def read_snapshot_pickle(data: bytes | os.PathLike[str] | str | BinaryIO, where: str = "snapshot", *,
                         per_byte: int = GROWTH_PER_BYTE, slack: int = GROWTH_SLACK) -> dict[str, Any]:
    """Unpickle ``data`` (bytes, a path or a binary file) allowing only plain containers; RunError on anything
    else, and when the objects made grow past ``per_byte`` bytes per byte read (+ ``slack``): counted while
    reading, so a small file that would make gigabytes stops after a few megabytes (with the cyclic collector
    paused: see :func:`no_gc`)."""
    opened = None
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            src: Any = io.BytesIO(data)
        elif isinstance(data, (str, os.PathLike)):
            src = opened = open_snapshot_file(data)[0]
        else:
            src = data
        # the collector paused: a collection on the way would free other garbage of the process and hide what the
        # pickle makes from the meter (a test worker read an 8 MB pickle of empty lists whole so), and walk all of it
        with no_gc():
            obj = _NoGlobals(io.BufferedReader(_Metered(src, per_byte, slack), _CHUNK)).load()
    except _OverMemory as exc:
        raise RunError(f"{where}: refused: the pickle makes far more objects than a torch memory snapshot of its "
                       f"size ({exc}); a crafted or damaged file") from None
    except pickle.UnpicklingError as exc:
        if "refused" in str(exc):
            raise RunError(f"{where}: refused: the pickle wants to run code ({exc}); "
                           "a torch memory snapshot holds only plain data") from None
        raise RunError(f"{where}: not a readable pickle ({exc})") from None
    except MemoryError:
        raise RunError(f"{where}: too large to read in the memory this process has (MemoryError); "
                       "read it on a machine with more memory") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            RecursionError, UnicodeDecodeError) as exc:
        raise RunError(f"{where}: not a readable pickle ({type(exc).__name__}: {exc})") from None
    finally:
        if opened is not None:
            opened.close()
    if not isinstance(obj, dict):
        raise RunError(f"{where}: not a torch memory snapshot (top level is {type(obj).__name__}, expected a dict)")
    if "segments" not in obj and "device_traces" not in obj:
        raise RunError(f"{where}: not a torch memory snapshot (no 'segments' key); "
                       "write one with torch.cuda.memory._dump_snapshot(path)")
    return obj
