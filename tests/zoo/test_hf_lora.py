"""HF Trainer + PEFT LoRA (tests/zoo/scripts/hf_lora.py, a tiny random-init Llama) under ``gpudash run``
and with the callback in the script: every number the Trainer logs, and the trainable / frozen split."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402


@pytest.mark.parametrize("how", ["gpudash-run", "callback"])
def test_lora_run_matches_the_trainers_log_and_shows_trainable_bytes(tmp_path: Path, zoo: Any, how: str) -> None:
    script = str(zoo.dir / "scripts" / "hf_lora.py")
    if how == "gpudash-run":
        proc = zoo.run(tmp_path / "run", sys.executable, script, str(tmp_path / "out"), cwd=tmp_path)
    else:
        import subprocess

        proc = subprocess.run([sys.executable, script, str(tmp_path / "out"), "--callback", str(tmp_path / "run")],
                              cwd=tmp_path, env=zoo.env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("LOG ")]
    train = {h["step"]: h for h in logs if "loss" in h}
    evals = [h for h in logs if "eval_loss" in h]
    m = re.search(r"trainable params: ([\d,]+) \|\| all params: ([\d,]+)", proc.stdout)
    assert m is not None
    trainable, total = (int(g.replace(",", "")) for g in m.groups())
    run = load_run(tmp_path / "run")
    try:
        assert run.status == "finished"
        s = run.steps.set_index("step")
        assert list(s.index) == sorted(train) == list(range(1, 7))  # global_step, as the Trainer logs it
        for step, h in train.items():
            assert s.loc[step, "loss"] == pytest.approx(h["loss"], rel=1e-5)
            assert s.loc[step, "lr"] == pytest.approx(h["learning_rate"], rel=1e-9)
            assert s.loc[step, "grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-5)
        assert (s["samples"] == 8).all() and (s["tokens"] == 8 * 16).all()
        ev = run.events[run.events["kind"] == "evaluation"]
        assert ev["step"].tolist() == [h["step"] for h in evals] == [3, 6, 6]  # the last: evaluate() after train()
        for h, data in zip(evals, ev["data"], strict=True):
            assert data["metrics"]["eval_loss"] == pytest.approx(h["eval_loss"], rel=1e-6)
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == 4 * total).all()
        assert (mem["trainable_params_bytes"] == 4 * trainable).all()
        assert (mem["grads_bytes"] == 4 * trainable).all()  # frozen weights have no gradients
        lora_tensors = 2 * 2 * 2  # A and B, q_proj and v_proj, 2 layers
        assert (mem["optimizer_bytes"].drop(index=1) == 2 * 4 * trainable + 4 * lora_tensors).all()

        from gpudash.analysis.facts import run_facts
        from gpudash.commands.info import summarize
        from gpudash.report import render_html

        f = run_facts(run)
        assert f.trainable_params_bytes == 4 * trainable and f.frozen_params_bytes == 4 * (total - trainable)
        assert f.to_json()["trainable_params_bytes"] == 4 * trainable
        line = next(x for x in summarize(run) if x.startswith("parameters"))
        assert "trainable" in line and "frozen" in line
        page = render_html(run)
        assert "params (trainable)" in page and "params (frozen)" in page
    finally:
        run.close()
