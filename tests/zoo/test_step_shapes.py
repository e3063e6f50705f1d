"""Optimizer steps of other shapes under ``gpudash run`` (tests/zoo/scripts/, each unchanged): L-BFGS, whose
closure runs forward and backward about 20 times inside one step (pytorch/examples' time-series example);
a GAN's two optimizers stepping in one iteration (dcgan's loop); SAM's two forward and backward passes per
step, by hand and through a closure (davda54/sam). Each is checked against the numbers the script prints."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from gpudash import load_run


def test_lbfgs_records_the_loss_step_returns_and_times_the_closures(tmp_path: Path, zoo: Any) -> None:
    steps = 2
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "time_sequence_lbfgs.py"),
                   "--steps", str(steps), cwd=tmp_path)
    # each step's closure prints every evaluation's loss; the step returns (and gpudash keeps) the first
    blocks = re.split(r"^STEP:\s+\d+$", proc.stdout, flags=re.M)[1:]
    evaluations = [[float(v) for v in re.findall(r"^loss: (\S+)$", b, re.M)] for b in blocks]
    tests = [float(v) for v in re.findall(r"^test loss: (\S+)$", proc.stdout, re.M)]
    assert len(evaluations) == steps and all(len(e) > 5 for e in evaluations)
    run = load_run(tmp_path / "run")
    try:
        assert run.meta["steps_from"].startswith("optimizer steps")
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(steps))
        for i in range(steps):
            assert s.loc[i, "loss"] == pytest.approx(evaluations[i][0], rel=1e-9)
            assert s.loc[i, "loss"] != pytest.approx(sum(evaluations[i]), rel=1e-3)  # not every evaluation
        assert (s["samples"] == 5).all()  # one batch of 5 sequences a step, however often it is evaluated
        # the repeated forwards and backwards are timed as what they are, the rest of step() as optimizer
        assert (s["forward_s"] > 0).all() and (s["backward_s"] > 0).all() and (s["optimizer_s"] > 0).all()
        assert ((s["forward_s"] + s["backward_s"] + s["optimizer_s"]) <= s["duration_s"] * 1.0001).all()
        ev = run.events[run.events["kind"] == "evaluation"]  # the prediction under no_grad after each step
        assert ev["step"].tolist() == [0, 1]  # the weights of the step before it
        assert [e["after_steps"] for e in ev["data"]] == [1, 2]
        assert [e["metrics"]["eval_loss"] for e in ev["data"]] == pytest.approx(tests, rel=1e-6)  # read as float32
    finally:
        run.close()


def test_gan_one_iteration_is_one_step_each_optimizers_loss_apart(tmp_path: Path, zoo: Any) -> None:
    iters = 4
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "gan.py"), "--iters", str(iters),
                   cwd=tmp_path)
    printed = re.findall(r"^\[(\d+)/\d+\] Loss_D: (\S+) Loss_G: (\S+)", proc.stdout, re.M)
    assert len(printed) == iters
    run = load_run(tmp_path / "run")
    try:
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(iters))  # the discriminator's and the generator's step: one step
        for i, d, g in printed:
            assert s.loc[int(i), "loss"] == pytest.approx(float(d), rel=1e-6)  # errD_real + errD_fake
            assert s.loc[int(i), "loss_generator"] == pytest.approx(float(g), rel=1e-6)
        assert (s["optimizer_s"] > 0).all() and (s["backward_s"] > 0).all()
    finally:
        run.close()


@pytest.mark.parametrize("form", [[], ["--closure"]], ids=["first_second_step", "closure"])
def test_sam_two_passes_are_one_step_with_the_first_loss(tmp_path: Path, zoo: Any, form: list[str]) -> None:
    steps = 4
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "sam.py"), "--steps", str(steps),
                   *form, cwd=tmp_path)
    loss = {int(i): float(v) for i, v in re.findall(r"^step (\d+) loss (\S+)$", proc.stdout, re.M)}
    run = load_run(tmp_path / "run")
    try:
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(steps))
        for i in range(steps):
            assert s.loc[i, "loss"] == pytest.approx(loss[i], rel=1e-6)  # the loss at the weights, not + the pushed
        assert (s["samples"] == 24).all()  # the second pass re-evaluates the same batch
    finally:
        run.close()
