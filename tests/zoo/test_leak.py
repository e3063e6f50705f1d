"""Issue 37: a leak named while the run goes. Unchanged scripts under ``gpudash run`` on CPU: a loop that keeps
its loss tensors (with their graphs) gets one ``leak`` event while it runs, at the rate of the bytes it keeps
(the script prints them, found by walking its own graph); the same loop keeping ``loss.item()`` gets none; and
the alert, the run page's header, the report, ``gpudash info`` and ``gpudash check --no-leak`` say the same
numbers. No false leak on the zoo's other loops nor on a run whose sequence length grows by bucketing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from gpudash import load_run
from gpudash.analysis.facts import run_facts
from gpudash.analysis.leak import BLOCKS, LEAK_EVENT, MIN_POINTS_PER_BLOCK, leak_text, recorded_leaks

# samples often enough that a few hundred fast steps hold enough of them; looks every second
FLAGS = ("--host-hz", "20", "--leak-poll-s", "1")


def _gpudash(zoo: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudash", *args], env=zoo.env(), capture_output=True, text=True,
                          timeout=120)


def test_a_loop_keeping_its_losses_gets_a_leak_event_while_it_runs(tmp_path: Path, zoo: Any) -> None:
    run_dir = tmp_path / "run"
    proc = zoo.run(run_dir, sys.executable, str(zoo.dir / "scripts" / "keep_losses.py"), "--steps", "300",
                   cwd=tmp_path, flags=(*FLAGS, "--alert", "kinds=leak", "--alert", "desktop=false"))
    kept = int(re.search(r"kept bytes per step (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
    run = load_run(run_dir)
    try:
        events = run.events[run.events["kind"] == LEAK_EVENT]
        assert len(events) == 1, events  # once per episode
        live = recorded_leaks(run)[0]
        assert int(events["step"].iloc[0]) < 299 and live.last_step < 299  # found while the loop ran
        assert live.per_step_bytes == pytest.approx(kept, rel=0.2)
        assert live.source == "malloc_used_bytes" and live.category is None and "on CPU" in live.seen
        alerts = run.events[run.events["kind"] == "alert"]
        assert list(alerts["message"]) == [leak_text(live)]  # the alert is the event's line
        assert f"alert [run] step {live.last_step}: {leak_text(live)}" in proc.stderr
        facts = run_facts(run)
        assert facts.leak is not None and facts.leak.per_step_bytes == pytest.approx(kept, rel=0.2)
        line = leak_text(facts.leak)
    finally:
        run.close()
    from gpudash.server.layouts.leakline import leak_line

    header = leak_line(facts.leak)
    assert header.id == "run-leak" and header.children[1].children == line  # type: ignore[index]
    info = _gpudash(zoo, "info", str(run_dir))
    assert line in info.stdout
    check = _gpudash(zoo, "check", str(run_dir), "--no-leak")
    assert check.returncode == 1 and f"FAIL no_leak: {line}" in check.stdout
    report = _gpudash(zoo, "report", str(run_dir), "--format", "md", "-o", str(tmp_path / "r.md"))
    assert report.returncode == 0 and line in (tmp_path / "r.md").read_text()


def test_the_same_loop_keeping_the_numbers_gets_none(tmp_path: Path, zoo: Any) -> None:
    run_dir = tmp_path / "run"
    zoo.run(run_dir, sys.executable, str(zoo.dir / "scripts" / "keep_losses.py"), "--steps", "300", "--keep", "item",
            cwd=tmp_path, flags=FLAGS)
    run = load_run(run_dir)
    try:
        assert not (run.events["kind"] == LEAK_EVENT).any()
        assert run_facts(run).leak is None
        # judged, not left unjudged: twice the samples the rule needs to cut its window into blocks
        assert len(run.host) >= 2 * BLOCKS * MIN_POINTS_PER_BLOCK
    finally:
        run.close()
    check = _gpudash(zoo, "check", str(run_dir), "--no-leak")
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("script", [("bucketed_lm.py", "--steps", "300"), ("manual_update.py", "--steps", "400"),
                                    ("amp_accum.py", "--steps", "300")], ids=lambda s: s[0].removesuffix(".py"))
def test_no_false_leak(tmp_path: Path, zoo: Any, script: tuple[str, ...]) -> None:
    """Loops that keep nothing between steps, one of them on sequences that grow bucket after bucket (its RSS
    rises with them: the rule reads malloc's in-use bytes and sees that the step's tokens grew)."""
    run_dir = tmp_path / "run"
    zoo.run(run_dir, sys.executable, str(zoo.dir / "scripts" / script[0]), *script[1:], cwd=tmp_path, flags=FLAGS)
    run = load_run(run_dir)
    try:
        assert not (run.events["kind"] == LEAK_EVENT).any()
        assert run_facts(run).leak is None
    finally:
        run.close()
