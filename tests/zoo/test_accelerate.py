"""Hugging Face accelerate's ``examples/by_feature/gradient_accumulation.py`` (Apache-2.0,
scripts/licenses/accelerate-LICENSE), unchanged, under ``gpudash run``: a library that asks where torch is
before torch is imported (``datasets``, through ``evaluate``) comes first, the model is a Hugging Face BERT and
``accelerator.accumulate`` makes one optimizer step of two micro-batches. Local only: ``bert-base-cased`` is a
folder made here (a tiny random BERT and its vocabulary), ``datasets`` and ``evaluate`` are the stand-ins in
``stubs/`` (a small MRPC-shaped corpus, the GLUE metric). Checked against what ``probe.py`` saw the same
script do: steps = optimizer steps, the loss of each, and every evaluation, the final one included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402

STUBS = Path(__file__).resolve().parent / "stubs"


def _bert(where: Path) -> None:
    """A tiny random BERT and a word-level vocabulary covering the stand-in corpus, saved as ``bert-base-cased``."""
    sys.path.insert(0, str(STUBS))
    try:
        from datasets import WORDS
    finally:
        sys.path.remove(str(STUBS))
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    where.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]
    (where / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(where / "vocab.txt"), do_lower_case=False).save_pretrained(where)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(cfg).save_pretrained(where)


@pytest.mark.slow
def test_gradient_accumulation_example_recorded_exactly(tmp_path: Path, zoo: Any) -> None:
    _bert(tmp_path / "bert-base-cased")
    script = str(zoo.dir / "scripts" / "accelerate_gradient_accumulation.py")
    args = ["--cpu", "--gradient_accumulation_steps", "2"]
    env = zoo.env()
    env["PYTHONPATH"] = os.pathsep.join([str(STUBS), env["PYTHONPATH"]])
    probe = subprocess.run([sys.executable, str(zoo.dir / "probe.py"), str(tmp_path / "probe.json"), script, *args],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads((tmp_path / "probe.json").read_text())
    rec = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "run"), "--",
                          sys.executable, script, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert rec.stdout == probe.stdout  # the same run: every epoch's metric printed the same
    steps = [p for p in seen if "lr" in p]
    assert len(steps) == 6  # 64 rows, batches of 16, 2 micro-batches a step, 3 epochs
    run = load_run(tmp_path / "run")
    try:
        assert run.status == "finished"
        s = run.steps.set_index("step")
        assert list(s.index) == list(range(6))
        for i, p in enumerate(steps):
            assert len(p["losses"]) == 2  # accelerator.backward of each micro-batch (divided by 2)
            assert s.loc[i, "loss"] == pytest.approx(sum(p["losses"]), rel=1e-5)
            assert s.loc[i, "lr"] == pytest.approx(p["lr"], rel=1e-9)
        assert (s["samples"] == 32).all()
        ev = run.events[run.events["kind"] == "evaluation"]
        evals = [(i, p["eval"]) for i, p in enumerate(seen) if p.get("eval")]  # after i optimizer steps
        assert [i for i, _ in evals] == [2, 4, 6]
        assert ev["step"].tolist() == [1, 3, 5]  # the weights of steps 1, 3 and 5: the last one is the final eval
        for (after, losses), data in zip(evals, ev["data"], strict=True):
            assert data["after_steps"] == after and data["split"] == "validation"
            assert data["metrics"]["eval_batches"] == len(losses) == 2  # 40 rows in batches of 32
            assert data["metrics"]["eval_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    finally:
        run.close()
