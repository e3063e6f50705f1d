"""A folder of many runs: summaries are computed once per run (kept in memory for any number of runs, and on
disk across server restarts) and again only when a run's files change."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from gpudash.server.background import summariser
from gpudash.server.layouts import runs
from gpudash.store import summarystore


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


# ---- pages: only the rows shown are summarised ---------------------------------------------------------------

SAMPLE = Path(__file__).resolve().parents[2] / "sample_runs" / "healthy"


def test_search_and_status_filter_apply_before_paging_newest_first() -> None:
    rows = [{"id": f"r{i:02d}", "name": "gpt" if i % 3 == 0 else "bert", "device": "cpu", "started": float(i),
             "status": "live" if i % 2 else "finished"} for i in range(30)]
    shown, page, pages, matching = runs.page_of(rows, "gpt", "finished", 0, per_page=2)
    # gpt and finished: i % 6 == 0 -> 0, 6, 12, 18, 24; newest first, then cut
    assert [r["id"] for r in shown] == ["r24", "r18"] and (page, pages, matching) == (0, 3, 5)
    shown, page, pages, _ = runs.page_of(rows, "gpt", "finished", 2, per_page=2)
    assert [r["id"] for r in shown] == ["r00"] and page == 2
    shown, page, _, _ = runs.page_of(rows, "gpt", "finished", 99, per_page=2)
    assert page == 2 and [r["id"] for r in shown] == ["r00"]  # past the end: the last page
    shown, page, pages, matching = runs.page_of(rows, None, "all", 0, per_page=50)
    assert [r["id"] for r in shown] == [f"r{i:02d}" for i in range(29, -1, -1)] and pages == 1
    assert runs.page_of(rows, "nothing", None, 3) == ([], 0, 1, 0)


@pytest.fixture(scope="module")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000 copies of sample_runs/healthy (rank file hard-linked; each its own run.json, name and start)."""
    root = tmp_path_factory.mktemp("thousand")
    meta = json.loads((SAMPLE / "run.json").read_text())
    for i in range(1000):
        d = root / f"run{i:04d}"
        d.mkdir()
        for f in SAMPLE.iterdir():
            if f.name != "run.json":
                os.link(f, d / f.name)
        (d / "run.json").write_text(json.dumps(dict(meta, name=f"exp-{i:04d}", created_at=1000.0 + i)))
    return root


@pytest.fixture
def summaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list[str]]:
    """Counts real summaries and meta-table reads (nothing cached in memory or on disk at the start)."""
    calls: dict[str, list[str]] = {"summary": [], "meta": [], "waited": []}
    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(runs, "_CACHE", type(runs._CACHE)())
    monkeypatch.setattr(runs, "_ENTRIES", {})
    real_summary, real_meta = runs.run_summary, runs._cheap_meta

    def summary(run_id: str, path: Path) -> dict[str, Any]:
        calls["summary"].append(run_id)
        if threading.current_thread() is threading.main_thread():
            calls["waited"].append(run_id)  # summarised while the list request waited
        return real_summary(run_id, path)

    def meta(path: Path) -> Any:
        calls["meta"].append(path.name)
        return real_meta(path)

    monkeypatch.setattr(runs, "run_summary", summary)
    monkeypatch.setattr(runs, "_cheap_meta", meta)
    return calls


#: The columns a row from a run's metadata shows as its summary will.
_SAME = ("id", "name", "status", "device", "started", "duration_s", "steps", "peak_bytes", "ranks", "end_reason")


def test_the_first_page_of_1000_runs_summarises_only_its_rows(thousand: Path, summaries: dict[str, list[str]]) -> None:
    listing = runs.list_page(thousand)
    assert listing.total == listing.matching == 1000 and listing.pages == 20
    assert [r["id"] for r in listing.rows] == [f"run{i:04d}" for i in range(999, 949, -1)]  # newest first
    # a cold list waits for the first SYNC_SUMMARIES rows only; the page's others come from their metadata
    assert summaries["waited"] == [f"run{i:04d}" for i in range(999, 999 - runs.SYNC_SUMMARIES, -1)]
    assert summaries["meta"] == []  # no filter: the rest of the list needs only run.json and file stamps
    row = listing.rows[0]
    assert row["name"] == "exp-0999" and row["status"] == "finished" and row["steps"] > 0
    assert row["facts"]["status"] == row["status"]  # every number comes from the facts
    pending = listing.rows[runs.SYNC_SUMMARIES:]
    assert all(r.get("pending") and r["facts"] is None for r in pending)
    assert all(not r.get("pending") for r in listing.rows[:runs.SYNC_SUMMARIES])
    assert summariser().wait(120)  # the background summarised the rest of the page, each once
    assert sorted(summaries["summary"]) == sorted(r["id"] for r in listing.rows)
    summaries["summary"].clear()
    again = runs.list_page(thousand)  # the 1 s live refresh: every row summarised now, none again
    assert summaries["summary"] == [] and not any(r.get("pending") for r in again.rows)
    for before, now in zip(listing.rows, again.rows, strict=True):  # the metadata's row said what the facts say
        assert [before[k] for k in _SAME] == [now[k] for k in _SAME]
    assert runs.row_signature(runs.list_page(thousand).rows) == runs.row_signature(again.rows)
    second = runs.list_page(thousand, page=1)
    assert [r["id"] for r in second.rows] == [f"run{i:04d}" for i in range(949, 899, -1)]
    assert summariser().wait(120)
    assert len(summaries["summary"]) == 50  # 10 at once, 40 in the background
    assert runs.page_label(second) == "51–100 of 1000 · page 2 of 20"


def test_search_finds_a_run_on_any_page_without_summarising_the_others(thousand: Path,
                                                                      summaries: dict[str, list[str]]) -> None:
    listing = runs.list_page(thousand, "EXP-0007", "finished")
    assert [r["id"] for r in listing.rows] == ["run0007"] and listing.matching == 1 and listing.total == 1000
    assert summaries["summary"] == ["run0007"]
    assert len(summaries["meta"]) == 1000  # the status filter read each run's meta table once ...
    summaries["meta"].clear()
    assert runs.list_page(thousand, "exp-0008", "finished").rows[0]["id"] == "run0008"
    assert summaries["meta"] == []  # ... and keeps it until the run's files change
    assert runs.list_page(thousand, None, "live").rows == []


def test_a_changed_run_is_summarised_again_and_moves(thousand: Path, summaries: dict[str, list[str]],
                                                      tmp_path: Path) -> None:
    folder = tmp_path / "few"
    folder.mkdir()
    for name in ("run0001", "run0002", "run0003"):
        os.link(thousand / name / "rank0.db", (folder / name).mkdir() or folder / name / "rank0.db")
        (folder / name / "run.json").write_text((thousand / name / "run.json").read_text())
    assert [r["id"] for r in runs.list_page(folder).rows] == ["run0003", "run0002", "run0001"]
    summaries["summary"].clear()
    (folder / "run0001" / "run.json").write_text(json.dumps({"name": "late", "created_at": 5000.0}))
    rows = runs.list_page(folder).rows
    assert [r["id"] for r in rows] == ["run0001", "run0003", "run0002"] and rows[0]["name"] == "late"
    assert summaries["summary"] == ["run0001"]


def test_a_live_run_is_summarised_again_only_when_it_changes_or_stops(tmp_path: Path, counted: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "runs", 3)
    (folder / "run0001" / "live").write_text("")
    writer = {"status": "live"}  # what the heartbeat says (RunReader.status)
    monkeypatch.setattr(runs, "_ENTRIES", {})
    monkeypatch.setattr(runs, "_cheap_meta", lambda path: ({}, writer["status"] if path.name == "run0001"
                                                           else "finished"))
    runs.list_page(folder)
    assert sorted(counted) == ["run0000", "run0001", "run0002"]
    counted.clear()
    runs.list_page(folder)
    assert counted == []  # nothing changed: the refresh summarises nothing, the live run included
    (folder / "run0001" / "live").write_text("a step more")
    runs.list_page(folder)
    assert counted == ["run0001"]
    counted.clear()
    writer["status"] = "crashed"  # the writer died: no file changes, the heartbeat goes stale
    runs.list_page(folder)
    assert counted == ["run0001"]


# ---- a row from metadata states what the run's facts state (one fact, one place) ---------------------------

SAMPLES_DIR = SAMPLE.parent


def test_a_row_from_metadata_is_the_facts_of_the_summary_and_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A cold list answers every run from its metadata (no summary waited for); its status, steps, peak memory,
    duration and ranks are those ``/api/runs/<id>/summary`` and ``gpudash info --json`` give, and the row the
    background summary gives the next listing: the facts, and nothing else."""
    from gpudash.cli import main
    from gpudash.server.app import create_app
    from gpudash.server.runcache import shared_cache

    monkeypatch.setenv(summarystore.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(runs, "_CACHE", type(runs._CACHE)())
    monkeypatch.setattr(runs, "_ENTRIES", {})
    monkeypatch.setattr(runs, "SYNC_SUMMARIES", 0)
    shared_cache().clear()
    root = tmp_path / "runs"
    names = ["healthy", "oom-crash", "oom-recovered", "strategy-bf16"]  # GPU-like and CPU peaks, a crash
    for name in names:
        shutil.copytree(SAMPLES_DIR / name, root / name)
    client = create_app(root).server.test_client()
    cold = {r["id"]: r for r in client.get("/api/runs").get_json()["runs"]}
    assert sorted(cold) == sorted(names) and all(r["pending"] and r["facts"] is None for r in cold.values())
    assert summariser().wait(120)
    warm = {r["id"]: r for r in client.get("/api/runs").get_json()["runs"]}
    for name in names:
        summary = client.get(f"/api/runs/{name}/summary").get_json()
        capsys.readouterr()
        assert main(["info", str(root / name), "--json"]) == 0
        facts = json.loads(capsys.readouterr().out)["facts"]
        want = [facts["status"], facts["steps"], facts["headline"]["peak_memory_bytes"],
                facts["headline"]["duration_s"], facts["ranks"]]
        assert want[1] > 0 and want[2] is not None and want[3] is not None
        for where in (cold[name], summary, warm[name]):
            assert [where["status"], where["steps"], where["peak_bytes"], where["duration_s"], where["ranks"]] == want
        assert not warm[name].get("pending") and warm[name]["facts"] == summary["facts"]
