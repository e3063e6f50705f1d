"""gpudash.server.deferred: a module imported when first read from, and a module made unimportable."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudash.server.deferred import Deferred, defer, finish, without


@pytest.fixture()
def slowmod(tmp_path: Path) -> Iterator[str]:
    name = f"gpudash_test_deferred_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(f"import time\nwith open({str(tmp_path / 'runs.log')!r}, 'a') as f:\n"
                                         "    f.write('x')\ntime.sleep(0.05)\nLOADS = [1]\nVALUE = 42\n"
                                         "def __getattr__(n):\n    if n == 'LATE':\n        return 'late'\n"
                                         "    raise AttributeError(n)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_import_binds_a_stand_in_until_read(slowmod: str) -> None:
    defer(slowmod)
    mod = __import__(slowmod)
    assert isinstance(mod, Deferred) and "VALUE" not in vars(mod)
    assert mod.VALUE == 42  # the first read imports it
    real = sys.modules[slowmod]
    assert not isinstance(real, Deferred) and real.VALUE == 42
    assert mod.LATE == "late"  # the real module's own lazy names still answer through the stand-in
    with pytest.raises(AttributeError):
        _ = mod.MISSING


def test_threads_read_one_import(slowmod: str) -> None:
    defer(slowmod)
    mod = __import__(slowmod)
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(mod.LOADS)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(s is seen[0] for s in seen)
    assert (Path(sys.modules[slowmod].__file__).parent / "runs.log").read_text() == "x"  # executed once, not eight


def test_finish_and_noop_when_imported(slowmod: str) -> None:
    defer(slowmod)
    finish(slowmod)
    real = sys.modules[slowmod]
    assert not isinstance(real, Deferred)
    defer(slowmod)  # already imported: left alone
    assert sys.modules[slowmod] is real
    finish(slowmod)
    assert sys.modules[slowmod] is real


def test_without_makes_import_fail(tmp_path: Path) -> None:
    name = "gpudash_test_never_there"
    without(name)
    try:
        with pytest.raises(ImportError):
            __import__(name)
    finally:
        sys.modules.pop(name, None)
