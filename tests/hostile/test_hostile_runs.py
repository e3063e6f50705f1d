"""Run folders from someone else (issue 26): each crafted case beside a healthy run answers on every
surface, in a process held to 2 GiB and within 30 s a surface, with one line naming the damage, while
the healthy run is listed and served. The cases are in ``hostile_cases.py``; ``probe.py`` asks the
surfaces (``load_run``, ``gpudash info``, ``gpudash report``, the run page, ``/api/runs``,
``/api/runs/<id>/summary``, ``/metrics``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from helpers.hostile_cases import CASES, healthy  # noqa: E402

#: Each surface answers within this (the issue's bound); the whole probe gets a surface's worth per surface.
SURFACE_S = 30.0
#: No answer carries a hostile run's bulk (the issue saw 200-400 MB answers).
MAX_ANSWER = 2_000_000


@pytest.fixture(scope="module")
def probe_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("cache")
    return {**os.environ, "PYTHONPATH": str(ROOT), "GPUDASH_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}


def _probe(runs: Path, bad: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(HERE / "probe.py"), str(runs), bad, "good"], capture_output=True,
                          text=True, env=env, cwd=runs, timeout=SURFACE_S * 10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_run_beside_a_healthy_one(case: str, tmp_path: Path, probe_env: dict[str, str]) -> None:
    make, words = CASES[case]
    runs = tmp_path / "runs"
    healthy(runs / "good")
    healthy(runs / case)
    make(runs / case)
    out = _probe(runs, case, probe_env)
    for surface, ans in out.items():
        if not isinstance(ans, dict):
            continue
        assert ans["raised"] is None, (surface, ans)
        assert ans["s"] < SURFACE_S, (surface, ans["s"])
        assert ans["size"] < MAX_ANSWER, (surface, ans["size"])
    assert out["peak_rss_bytes"] < 2 << 30
    # the healthy run beside it: loaded whole, drawn, listed, summarised and scraped
    good = json.loads(out["load_run_good"]["text"])
    assert good["steps"] == 30 and not good["problems"]
    assert out["page_good"]["text"].startswith("[run-problems] || ")  # drawn, nothing damaged
    listing = json.loads(out["api_runs"]["text"].split(" ", 1)[1])
    assert out["api_runs"]["text"].startswith("200 ")
    rows = {r["id"]: r for r in listing["runs"]}
    assert set(rows) == {"good", case} and rows["good"]["steps"] == 30 and rows["good"]["status"] == "finished"
    assert out["api_summary_good"]["text"].startswith("200 ") and out["api_summary"]["text"].startswith("200 ")
    assert 'gpudash_step{node=' in out["metrics"]["text"] or 'run="good"' in out["metrics"]["text"]
    assert 'run="good"' in out["metrics"]["text"]
    bad = json.loads(out["load_run"]["text"])
    if words is None:  # a valid run that is only awkward to read: read whole, nothing called damaged
        assert bad["steps"] == 30 and not bad["problems"], bad
        assert f'run="{case}"' in out["metrics"]["text"]
        return
    # the damage, named in one line by every surface
    lines = [p for p in bad["problems"] if words in p]
    assert len(lines) == 1, bad["problems"]
    assert "\n" not in lines[0] and len(lines[0]) < 400
    for surface in ("info", "report", "page", "api_summary", "api_runs"):
        assert words in out[surface]["text"], (surface, out[surface]["text"][:2000])
    assert "gpudash_run_damaged" in out["metrics"]["text"] and words in out["metrics"]["text"]
