"""One ETA everywhere: the run page header, the runs list and the trainer's terminal line say the same thing
about the same live run (all from gpudash.analysis.progress)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpudash.analysis.progress import eta_text
from gpudash.server.runcache import shared_cache


def _texts(component: Any) -> dict[str, str]:
    """Text of every component with an id or a class, by id (or class) — a small walk of a Dash tree."""
    out: dict[str, str] = {}

    def text(c: Any) -> str:
        if c is None:
            return ""
        if isinstance(c, str | int | float):
            return str(c)
        if isinstance(c, list | tuple):
            return "".join(text(x) for x in c)
        return text(getattr(c, "children", None))

    def walk(c: Any) -> None:
        if isinstance(c, list | tuple):
            for x in c:
                walk(x)
            return
        if c is None or isinstance(c, str | int | float):
            return
        for key in (getattr(c, "id", None), getattr(c, "className", None)):
            if isinstance(key, str):
                out.setdefault(key, text(c))
        walk(getattr(c, "children", None))

    walk(component)
    return out


@pytest.fixture()
def live_run(tmp_path: Path) -> Any:
    """A live run (its writer open, heartbeat fresh) of 30 recorded steps of 2 s (the first took 60 s) out of 500."""
    from gpudash.store.writer import Recorder

    rec = Recorder(tmp_path / "runs" / "eta", flush_interval=0.1, meta={"name": "eta", "device": "cpu"})
    rec.put_meta(total_steps=500)
    now = time.time()
    ends = [now - 2.0 * (29 - s) for s in range(30)]
    for s, t in enumerate(ends):
        rec.put("steps", {"step": s, "time": t, "duration_s": 60.0 if s == 0 else 1.9})
    assert rec.flush()
    yield tmp_path / "runs", ends
    rec.close()


def test_same_eta_in_header_runs_list_and_terminal(live_run: Any) -> None:
    from gpudash.server.layouts import runs
    from gpudash.server.layouts.pages import build_run_page
    from gpudash.trainer.progressline import ProgressLine

    root, ends = live_run
    shared_cache().clear()
    facts = shared_cache().get(root / "eta").facts
    assert facts.status == "live" and facts.progress is not None
    want = eta_text(facts.progress)
    assert want == "ETA 16 min"  # 470 steps left at 2 s (the slow first step does not count)

    reader, lock = shared_cache().reader(root / "eta")
    with lock:
        page = build_run_page("eta", reader)
    header = _texts(page)["progress-text"]
    assert header == f"step 30 of 500 · {want}"

    listing = runs.list_page(root)
    cell = _texts(runs.runs_table(root, listing.rows))["progress-cell"]
    assert cell == f"6 % · {want}"

    from gpudash.analysis.facts import headline_rows
    from gpudash.commands.info import summarize
    from gpudash.store import load_run

    # gpudash info and the report's table: the same row from the same facts
    row = dict(headline_rows(facts))["progress"]
    assert row == f"6 %, step 30 of 500 · {want}"
    run = load_run(root / "eta")
    assert f"{'progress':<13} 6 %, step 30 of 500 · {want}" in summarize(run)
    run.close()

    term = ProgressLine(500)
    for s, t in enumerate(ends):
        term.update(s + 1, 1.0, 1, 100.0, end=t)
    line = term.line(30, 1.0, 1, 100.0, now=term.start + 60.0)
    assert line.rstrip().endswith(want)


def test_progress_callback_follows_the_live_tick(live_run: Any) -> None:
    import json

    from helpers.dashpost import post

    from gpudash.server.app import create_app

    root, _ = live_run
    shared_cache().clear()
    app = create_app(root)
    client = app.server.test_client()
    resp = post(client, app, "run-progress.children", {"last-step.children": "29", "run-status.children": "live"},
                {"page-run.data": {"run": "eta", "rank": 0}})
    assert resp.status_code == 200
    body = json.dumps(resp.get_json())
    assert "step 30 of 500" in body and "ETA 16 min" in body
