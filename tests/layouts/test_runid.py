"""Run ids from URLs are untrusted: each way out of RUNS_DIR is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpudash.store.runid import InvalidRunId, list_run_dirs, resolve_run_dir, valid_run_id


def test_valid_run_resolves(runs_dir: Path) -> None:
    assert resolve_run_dir(runs_dir, "rich") == (runs_dir / "rich").resolve()
    assert [rid for rid, _ in list_run_dirs(runs_dir)] == ["plain", "rich"]


@pytest.mark.parametrize("bad", ["..", "../rich", "rich/..", "/etc", "/tmp", "a/b", "", ".", ".hidden",
                                 "rich\x00", "..%2f", "%2e%2e", "x" * 300, "rich/../../etc"])
def test_bad_ids_refused(runs_dir: Path, bad: str) -> None:
    assert not valid_run_id(bad) or bad in ("..%2f",)
    with pytest.raises(InvalidRunId):
        resolve_run_dir(runs_dir, bad)


def test_absolute_path_refused(runs_dir: Path) -> None:
    with pytest.raises(InvalidRunId):
        resolve_run_dir(runs_dir, str(runs_dir / "rich"))


def test_missing_and_non_run_refused(runs_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidRunId):
        resolve_run_dir(runs_dir, "nope")
    (runs_dir / "not-a-run").mkdir(exist_ok=True)
    with pytest.raises(InvalidRunId):
        resolve_run_dir(runs_dir, "not-a-run")


def test_symlink_escape_refused(runs_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(runs_dir / "plain", outside)
    link = runs_dir / "escape"
    link.symlink_to(outside, target_is_directory=True)
    try:
        with pytest.raises(InvalidRunId):
            resolve_run_dir(runs_dir, "escape")
        assert "escape" not in [rid for rid, _ in list_run_dirs(runs_dir)]
    finally:
        link.unlink()


def test_symlinked_rank_file_escape_refused(runs_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    shutil.copytree(runs_dir / "plain", outside)
    inner = runs_dir / "inner-link"
    inner.mkdir()
    try:
        os.symlink(outside / "rank0.db", inner / "rank0.db")
        with pytest.raises(InvalidRunId):
            resolve_run_dir(runs_dir, "inner-link")
    finally:
        shutil.rmtree(inner)


def test_symlink_inside_runs_dir_allowed(runs_dir: Path) -> None:
    link = runs_dir / "alias"
    link.symlink_to(runs_dir / "plain", target_is_directory=True)
    try:
        assert resolve_run_dir(runs_dir, "alias") == (runs_dir / "plain").resolve()
    finally:
        link.unlink()
