"""One atomic-write helper (issue 45): every file written whole through it, never through a planted link; the only
rename in the package."""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

import pytest

import gpudash
from gpudash.store.atomic import write_atomic
from gpudash.store.bounded import UnsafeFile


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def test_written_whole_replaced_and_nothing_left_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    assert write_atomic(path, "first")
    assert write_atomic(path, b"second", fsync=True)
    assert path.read_bytes() == b"second" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_exclusive_creates_only_when_absent(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    assert write_atomic(path, "rank 0", exclusive=True)
    assert not write_atomic(path, "rank 1", exclusive=True)
    assert path.read_text() == "rank 0" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_planted_link_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "out.json"
    _tmp_name(path).symlink_to(victim)
    write_atomic(path, "new")
    assert victim.read_text() == "keep" and path.read_text() == "new" and not path.is_symlink()


def test_below_a_root_a_linked_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFile):
        write_atomic(root / "run" / "meta.json", b"{}", root=root)
    assert not list((tmp_path / "elsewhere").iterdir())
    write_atomic(root / "meta.json", None, root=root, size=4096)  # a hole of that size
    assert (root / "meta.json").stat().st_size == 4096


def test_the_package_renames_files_in_one_place() -> None:
    base = Path(gpudash.__file__).parent
    found = []
    for path in base.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                    and node.func.attr in ("replace", "rename")):
                found.append(path.relative_to(base).as_posix())
    assert found == ["store/atomic.py"], found
