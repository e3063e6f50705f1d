"""pytorch/examples' actor-critic (scripts/actor_critic.py, unchanged, BSD-3-Clause) under ``gpudash run``: one
CartPole state of shape ``(4,)`` per forward, one optimizer step per episode. Each step's samples are the
episode's forwards (its reward: 1 a time step), not 4x them. ``gymnasium`` is the local stand-in in ``stubs/``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402

STUBS = Path(__file__).resolve().parent / "stubs"


@pytest.mark.slow
def test_unbatched_states_count_one_sample_each(tmp_path: Path, zoo: Any) -> None:
    env = zoo.env()
    env["PYTHONPATH"] = os.pathsep.join([str(STUBS), env["PYTHONPATH"]])
    env["GYM_STUB_REWARD_THRESHOLD"] = "12"  # solved after a few episodes
    script = str(zoo.dir / "scripts" / "actor_critic.py")
    proc = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "run"), "--",
                           sys.executable, script, "--log-interval", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rewards = [float(x) for x in re.findall(r"^Episode \d+\tLast reward: (\S+)\t", proc.stdout, re.M)]
    assert "Solved!" in proc.stdout
    run = load_run(tmp_path / "run")
    try:
        s = run.steps
        assert len(rewards) > 1 and list(s["step"]) == list(range(len(rewards)))  # one step an episode
        assert list(s["samples"]) == rewards  # one forward a time step: the reward, not 4x it
        assert run.meta["steps_from"].startswith("optimizer steps")
    finally:
        run.close()
