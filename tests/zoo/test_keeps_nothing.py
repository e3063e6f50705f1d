"""Issue 41, items 1 and 2: under ``gpudash run`` with activations measured every step, nothing of gpudash's
rides on the script's model, and no graph outlives the script's references to it.

- pytorch/examples' word language model, unchanged (``scripts/word_language_model``), saves its whole model
  each epoch (``torch.save(model, f)``) and loads it back with ``weights_only`` and its own safe globals: it
  runs to the end and prints the numbers it prints bare.
- A loop that pickles and deep-copies its model every step, and scripts and exports it once, mid-step: no copy
  carries a hook, and every loss is the bare run's.
- Loops whose graphs outlive ``backward()`` (``retain_graph=True``, a gradient penalty's ``create_graph=True``)
  grow no more measured every step than measured never, where the pack hook's reference cycle kept every
  measured step's graph; double backward, reentrant checkpointing (its recomputation runs in the backward
  phase) and bf16 autocast print the bare losses and their activations are measured (non-reentrant
  checkpointing and ``torch.compile`` are held to the same in-process: tests/collectors/test_activations.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from gpudash import load_run

EVERY_STEP = ("--activations-every", "1", "--host-hz", "0")
WLM = ("--epochs", "2", "--emsize", "16", "--nhid", "16", "--batch_size", "4", "--bptt", "10", "--use-optimizer",
       "--lr", "0.002", "--log-interval", "20")


def _bare(zoo: Any, *command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(command), cwd=cwd, env=zoo.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _numbers(stdout: str) -> list[str]:
    """The script's printed lines without its timings."""
    return [re.sub(r"(time: +[\d.]+s|ms/batch +[\d.]+)", "", line) for line in stdout.splitlines()]


@pytest.mark.slow
def test_word_language_model_saves_its_whole_model_each_epoch(tmp_path: Path, zoo: Any) -> None:
    wlm = zoo.dir / "scripts" / "word_language_model"
    command = (sys.executable, str(wlm / "main.py"), "--data", str(wlm / "data" / "wikitext-2"), *WLM)
    (tmp_path / "bare").mkdir()
    bare = _bare(zoo, *command, "--save", "model.pt", cwd=tmp_path / "bare")
    (tmp_path / "mon").mkdir()
    mon = zoo.run(tmp_path / "run", *command, "--save", "model.pt", cwd=tmp_path / "mon", flags=EVERY_STEP)
    assert "End of training" in mon.stdout and "stopped recording" not in mon.stderr
    assert _numbers(mon.stdout) == _numbers(bare.stdout)
    assert mon.stdout.count("end of epoch") == 2 and (tmp_path / "mon" / "model.pt").stat().st_size > 0
    run = load_run(tmp_path / "run")
    try:
        steps = len(run.steps)
        measured = run.memory["activations_bytes"].dropna()
        assert steps >= 100 and len(measured) >= steps - 2  # every step but the first, in both epochs
        assert (measured > 0).all() and {"encoder", "rnn", "decoder"} <= set(run.activations["module"])
    finally:
        run.close()


@pytest.mark.slow
def test_a_loop_saving_and_copying_its_model_every_step(tmp_path: Path, zoo: Any) -> None:
    command = (sys.executable, str(zoo.dir / "scripts" / "save_and_copy.py"), "--steps", "6")
    bare = _bare(zoo, *command, cwd=tmp_path)
    mon = zoo.run(tmp_path / "run", *command, cwd=tmp_path, flags=EVERY_STEP)
    assert mon.stdout == bare.stdout
    assert mon.stdout.count("hooks saved 0 copied 0 True") == 6
    assert "scripted and exported at step 3: True hooks 0" in mon.stdout
    run = load_run(tmp_path / "run")
    try:
        assert len(run.steps) == 6
        assert (run.memory["activations_bytes"].dropna() > 0).sum() == 5  # every step after the first
    finally:
        run.close()


def _growth(stdout: str) -> float:
    return float(re.search(r"malloc growth late half B/step (-?[\d.]+)", stdout).group(1))  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["retain", "penalty"])
def test_kept_graphs_are_not_kept_longer_when_measured(tmp_path: Path, zoo: Any, mode: str) -> None:
    """A graph of 64 KiB saved a step: measured every step, the pack hook's cycle kept each one (retain: +65 KB
    a step). Held against the same run measured never, so only what measuring adds is judged (the Monitor's
    own state grows alike in both); the bare run's losses are printed again."""
    command = (sys.executable, str(zoo.dir / "scripts" / "graph_loops.py"), "--mode", mode, "--steps", "300",
               "--batch", "64", "--width", "128")
    bare = _bare(zoo, *command, cwd=tmp_path)
    every = zoo.run(tmp_path / "every", *command, cwd=tmp_path, flags=EVERY_STEP)
    never = zoo.run(tmp_path / "never", *command, cwd=tmp_path, flags=("--activations-every", "1000000",
                                                                      "--host-hz", "0"))
    losses = [line for line in bare.stdout.splitlines() if line.startswith("step ")]
    assert [line for line in every.stdout.splitlines() if line.startswith("step ")] == losses
    assert _growth(every.stdout) < _growth(never.stdout) + 2048, (every.stdout[-200:], never.stdout[-200:])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["double", "checkpoint-reentrant", "bf16"])
def test_bare_numbers_and_measured_activations(tmp_path: Path, zoo: Any, mode: str) -> None:
    command = (sys.executable, str(zoo.dir / "scripts" / "graph_loops.py"), "--mode", mode, "--steps", "4")
    bare = _bare(zoo, *command, cwd=tmp_path)
    mon = zoo.run(tmp_path / "run", *command, cwd=tmp_path, flags=EVERY_STEP)
    losses = [line for line in bare.stdout.splitlines() if line.startswith("step ")]
    assert [line for line in mon.stdout.splitlines() if line.startswith("step ")] == losses
    run = load_run(tmp_path / "run")
    try:
        act = run.memory.set_index("step")["activations_bytes"].dropna()
        assert list(act.index) == [1, 2, 3] and (act > 0).all()
        # 16 x 64 floats a saved tensor: the checkpointed middle block saves only its input, the rest several
        assert act.min() >= 16 * 64 * (2 if mode == "bf16" else 4)
    finally:
        run.close()
