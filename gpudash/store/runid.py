"""Run ids: the name of a run folder directly inside RUNS_DIR, checked before any file is opened.

A run id from a URL is untrusted. It must be one path component of safe
characters, and the folder it names must resolve (symlinks followed) inside
RUNS_DIR; anything else is refused the same way as a run that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpudash.store.listed import listed_root, listed_runs, materialize
from gpudash.store.reader import is_run_dir

__all__ = ["InvalidRunId", "list_nested_run_dirs", "list_run_dirs", "resolve_run_dir", "valid_run_id"]

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=@-]{0,199}$")


class InvalidRunId(LookupError):
    """Not a run of this dashboard (bad id, outside RUNS_DIR, or not a run folder)."""


def valid_run_id(run_id: str) -> bool:
    return bool(_RUN_ID.match(run_id)) and ".." not in run_id


def resolve_run_dir(runs_dir: Path, run_id: str) -> Path:
    """The run folder ``RUNS_DIR/run_id``, or :class:`InvalidRunId`."""
    if not isinstance(run_id, str) or not valid_run_id(run_id):
        raise InvalidRunId(f"not a valid run id: {run_id!r}")
    root = runs_dir.resolve()
    path = (root / run_id).resolve()
    if path.parent != root:
        raise InvalidRunId(f"run {run_id!r} resolves outside the runs directory")
    materialize(path)  # a run listed from an object store gets its folder as it is opened
    if not path.is_dir() or not is_run_dir(path):
        raise InvalidRunId(f"no run named {run_id!r}")
    for child in path.iterdir():
        # a rank file that is a symlink out of RUNS_DIR would leak another folder's data
        if child.is_symlink() and not child.resolve().is_relative_to(root):
            raise InvalidRunId(f"run {run_id!r} links outside the runs directory")
    return path


def list_run_dirs(runs_dir: Path) -> list[tuple[str, Path]]:
    """(run id, folder) for every run directly inside ``runs_dir`` that resolves inside it (a folder listed
    from an object store: the runs listed, :mod:`gpudash.store.listed`, whose folders exist once opened)."""
    listed = listed_root(runs_dir)
    if listed is not None:
        return [(run_id, listed / run_id) for run_id in sorted(listed_runs(listed) or {})]
    out = []
    try:
        children = sorted(runs_dir.iterdir())
    except OSError:
        return []
    for child in children:
        try:
            out.append((child.name, resolve_run_dir(runs_dir, child.name)))
        except (InvalidRunId, OSError):
            continue
    return out


def list_nested_run_dirs(runs_dir: Path) -> list[tuple[str, Path]]:
    """:func:`list_run_dirs`, plus the runs one folder down (id ``group/run``), each level held to
    the same rules: a group folder must resolve directly inside ``runs_dir``."""
    out = list_run_dirs(runs_dir)
    if listed_root(runs_dir) is not None:
        return out  # an object store's prefix: its runs, listed
    try:
        children = sorted(runs_dir.iterdir())
        root = runs_dir.resolve()
    except OSError:
        return out
    for child in children:
        try:
            if not valid_run_id(child.name) or child.resolve().parent != root or not child.is_dir() \
                    or is_run_dir(child):
                continue
        except OSError:
            continue
        out.extend((f"{child.name}/{run_id}", path) for run_id, path in list_run_dirs(child))
    return out
