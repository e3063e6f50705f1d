"""Issue 37: a leak named while the run goes. Unchanged scripts under ``gpudash run`` on CPU: a loop that keeps
its loss tensors (with their graphs) gets one ``leak`` event while it runs, at the rate of the bytes it keeps
(the script prints them, found by walking its own graph); the same loop keeping ``loss.item()`` gets none; and
the alert, the run page's header, the report, ``gpudash info`` and ``gpudash check --no-leak`` say the same
numbers. No false leak on the zoo's other loops nor on a run whose sequence length grows by bucketing.

Issue 41: all of it at default options (malloc's in-use bytes read at step boundaries, the watch looking by
steps as well as by time), one judge (the run's leak fact is the recorded live episode: every surface says the
alert's numbers), and a loop keeping a validation loss computed without ``no_grad`` (1.6 MiB a step) named within
100 steps of its start."""

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

# default options: the rule reads malloc at step boundaries, the watch looks by steps (no timer to tune)
FLAGS: tuple[str, ...] = ()


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
        assert facts.leak == live  # one judge: the fact is the episode the alert named, same window, same numbers
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
        # judged, not left unjudged: twice the samples the rule needs to cut its window into blocks, read at
        # step boundaries (how many a timer gets depends on the machine's load; steps do not)
        held = run.memory["malloc_used_bytes"].notna().sum()
        assert held >= 2 * BLOCKS * MIN_POINTS_PER_BLOCK
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


def test_a_validation_loss_kept_with_its_graph_is_named_within_100_steps(tmp_path: Path, zoo: Any) -> None:
    """1.6 MiB kept a step from step 0, at default options (one host sample a second, a look every 5 s):
    named by steps, and the fact is the live episode."""
    run_dir = tmp_path / "run"
    proc = zoo.run(run_dir, sys.executable, str(zoo.dir / "scripts" / "val_metric.py"), "--steps", "160",
                   cwd=tmp_path, flags=("--activations-every", "1000000"))
    m = re.search(r"kept bytes per step (\d+) from step (\d+)", proc.stdout)
    assert m is not None, proc.stdout
    kept, start = int(m.group(1)), int(m.group(2))
    run = load_run(run_dir)
    try:
        events = run.events[run.events["kind"] == LEAK_EVENT]
        assert len(events) == 1, events
        named_at = int(events["step"].iloc[0])
        assert named_at - start <= 100, (named_at, len(run.host))
        live = recorded_leaks(run)[0]
        assert live.source == "malloc_used_bytes" and live.per_step_bytes == pytest.approx(kept, rel=0.2)
        assert run_facts(run).leak == live
    finally:
        run.close()
