"""gpudash.testing: the one toy loop shared by tests, benchmarks and scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gpudash
from gpudash.monitor import Monitor
from gpudash.testing import ToyLoop, mlp


def test_importing_it_does_not_import_torch() -> None:
    # runs where torch is missing too: that is where importing it would break a torch-free install
    code = "import sys, gpudash.testing; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


torch = pytest.importorskip("torch")


def test_mlp_shapes_and_activations() -> None:
    m = mlp((8, 16, 4), "gelu")
    assert [type(x).__name__ for x in m] == ["Linear", "GELU", "Linear"]
    assert [type(x).__name__ for x in mlp([5] * 4, None)] == ["Linear"] * 3
    with pytest.raises(ValueError, match="at least"):
        mlp((8,))


def test_monitored_steps_do_the_same_work_as_bare_steps(tmp_path: Path) -> None:
    bare = ToyLoop((8, 16, 3), lr=1e-2, batch=4, clip_grad_norm=1.0)
    losses = [float(bare.bare_step()) for _ in range(5)]
    loop = ToyLoop((8, 16, 3), lr=1e-2, batch=4, tokens_per_sample=2, clip_grad_norm=1.0)
    with Monitor(tmp_path / "r", host_hz=0) as mon:
        for _ in range(5):
            with loop.step(mon) as s:
                assert mon.current_phase is None and s.grad_norm is not None
                mon.log(loss=s.loss)
    steps = gpudash.load_run(tmp_path / "r").steps
    assert steps["loss"].tolist() == pytest.approx(losses)  # same seed: same batches, same updates
    assert steps["samples"].tolist() == [4] * 5 and steps["tokens"].tolist() == [8] * 5
    assert {"data_s", "forward_s", "backward_s", "optimizer_s"} <= set(steps.columns)
    assert loop.step_index == 5


def test_a_fixed_batch_has_no_data_phase(tmp_path: Path) -> None:
    loop = ToyLoop((8, 4), batch=2, labels=None, fixed_batch=True)
    with Monitor(tmp_path / "r", host_hz=0) as mon:
        loop.train(mon, 3, lr=0.5)
    steps = gpudash.load_run(tmp_path / "r").steps
    assert "data_s" not in steps and steps["lr"].tolist() == [0.5] * 3
    assert steps["loss"].is_monotonic_decreasing  # the same batch, learned


def test_a_failing_phase_ends_the_step_and_propagates(tmp_path: Path) -> None:
    class Broken(ToyLoop):
        def backward(self, loss: object, step: int) -> None:
            if step == 1:
                raise RuntimeError("boom")
            super().backward(loss, step)  # type: ignore[arg-type]

    loop = Broken((8, 4), batch=2)
    with Monitor(tmp_path / "r", host_hz=0) as mon:
        loop.train(mon, 1)
        with pytest.raises(RuntimeError, match="boom"), loop.step(mon):
            pytest.fail("the body runs only after the phases")
        loop.train(mon, 1)
        assert mon.current_phase is None
    assert gpudash.load_run(tmp_path / "r").steps["step"].tolist() == [0, 1]
