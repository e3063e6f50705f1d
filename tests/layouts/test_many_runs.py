"""A folder of many runs: summaries are computed once per run (kept in memory for any number of runs, and on
disk across server restarts) and again only when a run's files change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpudash.analysis import summarystore
from gpudash.layouts import runs


def _folder(root: Path, n: int) -> Path:
    for i in range(n):
        d = root / f"run{i:04d}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"name": d.name, "created_at": 1000.0 + i}))
    return root


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """run_summary replaced by a cheap one that counts its calls (the caching, not the summary, is tested)."""
    calls: list[str] = []
    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(runs, "_CACHE", type(runs._CACHE)())

    def fake(run_id: str, path: Path) -> dict[str, Any]:
        calls.append(run_id)
        status = "live" if (path / "live").exists() else "finished"
        return {"id": run_id, "name": run_id, "status": status, "started": json.loads(
            (path / "run.json").read_text())["created_at"], "steps": 1}

    monkeypatch.setattr(runs, "run_summary", fake)
    return calls


def test_more_runs_than_ever_cached_before_are_summarised_once(tmp_path: Path, counted: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, "off")  # memory only
    folder = _folder(tmp_path / "runs", 600)  # the old in-memory bound was 512: every listing reloaded them all
    rows = runs.list_runs(folder)
    assert len(rows) == 600 and rows[0]["id"] == "run0599"  # newest first
    assert len(counted) == 600
    counted.clear()
    assert [r["id"] for r in runs.list_runs(folder)] == [r["id"] for r in rows]
    assert counted == []


def test_a_restarted_server_reads_summaries_from_disk(tmp_path: Path, counted: list[str]) -> None:
    folder = _folder(tmp_path / "runs", 5)
    (folder / "run0002" / "live").write_text("")
    runs.list_runs(folder)
    runs._CACHE.clear()  # a new process: nothing in memory
    counted.clear()
    runs.list_runs(folder)
    assert counted == ["run0002"]  # a live run is never taken from the store
    runs._CACHE.clear()
    counted.clear()
    (folder / "run0003" / "run.json").write_text(json.dumps({"name": "renamed", "created_at": 2000.0}))
    rows = runs.list_runs(folder)
    assert sorted(counted) == ["run0002", "run0003"]  # a changed file: summarised again
    assert rows[0]["id"] == "run0003"


def test_store_misses_on_another_version_and_can_be_turned_off(tmp_path: Path, counted: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "runs", 3)
    runs.list_runs(folder)
    runs._CACHE.clear()
    counted.clear()
    monkeypatch.setattr(summarystore, "__version__", "9.9.9")
    runs.list_runs(folder)
    assert len(counted) == 3
    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, "off")
    runs._CACHE.clear()
    counted.clear()
    runs.list_runs(folder)
    runs._CACHE.clear()
    runs.list_runs(folder)
    assert len(counted) == 6


def test_an_unusable_cache_folder_only_costs_speed(tmp_path: Path, counted: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, str(blocker / "cache"))
    folder = _folder(tmp_path / "runs", 2)
    assert len(runs.list_runs(folder)) == 2
    assert summarystore.summary_store().problem is not None
    assert not os.path.exists(blocker / "cache")
