"""Hand-written loops under ``gpudash run`` (tests/zoo/scripts/, each unchanged): weights updated without
an optimizer, a torch.amp GradScaler loop with accumulation, a torch.compile'd model. Each is checked against
the numbers it prints: steps, loss (1e-5 relative), lr, samples; memory categories to the byte."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402


def _printed(out: str, key: str) -> dict[int, float]:
    return {int(i): float(v) for i, v in re.findall(rf"^step (\d+) .*?\b{key} (\S+)", out, re.M)}


def _param_bytes(*sizes: tuple[int, ...]) -> int:
    return 4 * sum(int(torch.tensor(s).prod()) for s in sizes)


# manual_update.py's model: Embedding(50, 16), Linear(128, 64), Linear(64, 50)
MANUAL_PARAMS = _param_bytes((50, 16), (64, 128), (64,), (50, 64), (50,))


@pytest.mark.parametrize("flags", [["--style", "data"], ["--style", "no_grad", "--accum", "2"]], ids=["data", "no_grad-accum"])
def test_manual_update_loop_counts_a_step_per_backward(tmp_path: Path, zoo: Any, flags: list[str]) -> None:
    steps = 6
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "manual_update.py"), "--steps", str(steps),
                   *flags, cwd=tmp_path)
    loss = _printed(proc.stdout, "loss")
    samples = _printed(proc.stdout, "samples")
    assert sorted(loss) == list(range(steps))
    run = load_run(tmp_path / "run")
    try:
        assert run.status == "finished"
        assert run.meta["steps_from"].startswith("backward() calls")
        from gpudash.analysis.summary import summarize
        from gpudash.commands.info import summarize as info_lines

        assert any(line.startswith("steps from") and "backward() calls" in line for line in info_lines(run))
        # the run page's summary panel shows the verdicts; a loaded machine may rank a bottleneck above the status
        status = next(v for v in summarize(run) if v.kind == "status")
        assert any("backward() calls" in e for e in status.evidence)
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(steps))  # micro-batches that accumulate stay one step
        for i in range(steps):
            assert s.loc[i, "loss"] == pytest.approx(loss[i], rel=1e-5)
            assert s.loc[i, "samples"] == samples[i]
            assert s.loc[i, "tokens"] == samples[i] * 8
        assert (s.loc[1:, "update_s"] > 0).all()  # the hand-written update, a phase of its own
        assert (s["forward_s"] > 0).all() and (s["backward_s"] > 0).all()
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == MANUAL_PARAMS).all() and (mem["trainable_params_bytes"] == MANUAL_PARAMS).all()
        assert (mem["grads_total_bytes"] == MANUAL_PARAMS).all()
        assert (mem["optimizer_bytes"] == 0).all()
        ev = run.events[run.events["kind"] == "evaluation"]  # the evaluation after training: the last step's weights
        assert ev["step"].tolist() == [steps - 1] and ev["data"].iloc[0]["after_steps"] == steps
        printed_eval = float(re.search(r"^eval loss (\S+)$", proc.stdout, re.M).group(1))
        assert ev["data"].iloc[0]["metrics"]["eval_loss"] == pytest.approx(printed_eval, rel=1e-6)
    finally:
        run.close()


def test_grad_scaler_loop_with_accumulation(tmp_path: Path, zoo: Any) -> None:
    steps, accum = 6, 3
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "amp_accum.py"), "--steps", str(steps),
                   "--accum", str(accum), cwd=tmp_path)
    loss, lr = _printed(proc.stdout, "loss"), _printed(proc.stdout, "lr")
    run = load_run(tmp_path / "run")
    try:
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(steps))
        for i in range(steps):
            assert s.loc[i, "loss"] == pytest.approx(loss[i], rel=1e-5)  # unscaled: not 4096 x
            assert s.loc[i, "lr"] == pytest.approx(lr[i], rel=1e-12)
        assert (s["samples"] == 12 * accum).all()
        params = _param_bytes((96, 24), (96,), (96, 96), (96,), (10, 96), (10,))
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == params).all()
        assert (mem["grads_bytes"] == params).all()  # micro-batches 2 and 3 run with every gradient
        assert mem.loc[0, "optimizer_bytes"] == 0
        assert (mem["optimizer_bytes"].drop(index=0) == 2 * params + 4 * 6).all()  # AdamW moments + step counters
    finally:
        run.close()


def test_compiled_model(tmp_path: Path, zoo: Any) -> None:
    """``torch.compile`` through Dynamo and AOTAutograd (``aot_eager``: Inductor's C++ build took 87 s for this
    model on the 2-core CI machine; the hooks gpudash relies on are the same)."""
    steps = 4
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "compiled.py"), "--steps", str(steps),
                   "--backend", "aot_eager", cwd=tmp_path)
    loss = _printed(proc.stdout, "loss")
    run = load_run(tmp_path / "run")
    try:
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(steps))
        for i in range(steps):
            assert s.loc[i, "loss"] == pytest.approx(loss[i], rel=1e-5)
        assert (s["samples"] == 8).all()
        params = _param_bytes((32, 16), (32,), (4, 32), (4,))
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == params).all()
        assert (mem["optimizer_bytes"].drop(index=0) == 2 * params + 4 * 4).all()
    finally:
        run.close()
