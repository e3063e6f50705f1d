"""A LightningModule (tests/zoo/scripts/lightning_module.py) under ``gpudash run``: steps numbered as
Lightning's global_step, loss (the mean of the step's two training_step losses), lr, the validation loss
it logged, memory to the byte."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning.pytorch")

from gpudash import load_run  # noqa: E402


def test_lightning_module_under_gpudash_run(tmp_path: Path, zoo: Any) -> None:
    proc = zoo.run(tmp_path / "run", sys.executable, str(zoo.dir / "scripts" / "lightning_module.py"),
                   str(tmp_path / "root"), cwd=tmp_path)
    out = proc.stdout
    losses: dict[int, list[float]] = {}
    for step, loss in re.findall(r"^batch \d+ global_step (\d+) loss (\S+)$", out, re.M):
        losses.setdefault(int(step) + 1, []).append(float(loss))  # the step it belongs to: global_step + 1
    lr = {int(s): float(v) for s, v in re.findall(r"^step (\d+) lr (\S+)$", out, re.M)}
    vals = [(int(s), float(v)) for s, v in re.findall(r"^val global_step (\d+) val_loss (\S+)$", out, re.M)]
    run = load_run(tmp_path / "run")
    try:
        assert run.meta["config"]["framework"] == "lightning"
        s = run.steps.set_index("step")
        assert list(s.index) == sorted(lr) == list(range(1, 7))
        for step in s.index:
            assert len(losses[step]) == 2
            assert s.loc[step, "loss"] == pytest.approx(sum(losses[step]) / 2, rel=1e-5)
            assert s.loc[step, "lr"] == pytest.approx(lr[step], rel=1e-12)
        assert (s["samples"] == 16).all()
        ev = run.events[run.events["kind"] == "evaluation"]
        assert [(int(a), b["metrics"]["val_loss"]) for a, b in zip(ev["step"], ev["data"], strict=True)] == \
            [(st, pytest.approx(v, rel=1e-6)) for st, v in vals] and [st for st, _ in vals] == [3, 6]
        params = 4 * (16 * 32 + 32 + 32 + 1)
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == params).all() and (mem["trainable_params_bytes"] == params).all()
        assert (mem["grads_bytes"] == params).all()
        assert mem.loc[1, "optimizer_bytes"] == 0
        assert (mem["optimizer_bytes"].drop(index=1) == 2 * params + 4 * 4).all()  # Adam: 2 moments + 4 step counters
    finally:
        run.close()
