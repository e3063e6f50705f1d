"""nanoGPT (karpathy/nanoGPT, MIT, vendored unchanged in nanogpt/) under ``gpudash run``.

A tiny character-level GPT on CPU, configured through nanoGPT's own configurator (``--key=value``), data
made at test time from local text: gradient accumulation 2 (nanoGPT divides each micro-batch loss by it
before ``backward()``), an evaluation every 5 iterations and a checkpoint after each (from iteration 5 on).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from helpers import nanogpt as nanogpt_runner  # noqa: E402

from gpudash import load_run  # noqa: E402

CONFIG = {"device": "cpu", "compile": False, "dtype": "float32", "dataset": "tiny", "out_dir": "out",
          "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "bias": False, "dropout": 0.0,
          "batch_size": 4, "gradient_accumulation_steps": 2, "max_iters": 12, "eval_interval": 5, "eval_iters": 3,
          "log_interval": 1, "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 2, "lr_decay_iters": 12,
          "always_save_checkpoint": True, "wandb_log": False}


def _get_lr(it: int) -> float:
    """nanoGPT's own schedule (train.py get_lr) with CONFIG's numbers."""
    lr, warm, decay, low = CONFIG["learning_rate"], CONFIG["warmup_iters"], CONFIG["lr_decay_iters"], CONFIG["min_lr"]
    if it < warm:
        return lr * (it + 1) / (warm + 1)
    if it > decay:
        return low
    return low + 0.5 * (1.0 + math.cos(math.pi * (it - warm) / (decay - warm))) * (lr - low)


def _model(work: Path, vocab: int) -> Any:
    spec = importlib.util.spec_from_file_location("_nanogpt_model", work / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    keys = ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout")
    return mod.GPT(mod.GPTConfig(vocab_size=vocab, **{k: CONFIG[k] for k in keys}))


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory: pytest.TempPathFactory, zoo: Any) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("nanogpt")
    vocab = nanogpt_runner.prepare(work)
    args = nanogpt_runner.command(CONFIG)[2:]  # train.py's arguments: the probe runs train.py itself
    # estimate_loss runs eval_iters batches of train, then of val: named, each half's mean is recorded
    proc = zoo.run(work / "run", sys.executable, str(zoo.dir / "probe.py"), str(work / "probe.json"), "train.py",
                   *args, cwd=work, flags=("--eval-splits", "train,val"))
    return {"work": work, "vocab": vocab, "out": proc.stdout, "iters": nanogpt_runner.iterations(proc.stdout),
            "probe": json.loads((work / "probe.json").read_text())}


def test_steps_loss_lr_samples_tokens_are_nanogpts(nanogpt: dict[str, Any]) -> None:
    out = nanogpt["out"]
    printed = {i: loss for i, loss, _ in nanogpt["iters"]}
    accum = CONFIG["gradient_accumulation_steps"]
    assert sorted(printed) == list(range(CONFIG["max_iters"] + 1))  # nanoGPT runs iterations 0..max_iters
    probe = nanogpt["probe"]
    assert len(probe) == len(printed)
    for i, p in enumerate(probe):  # the probe saw what nanoGPT printed: the last micro-batch loss x accum
        assert len(p["losses"]) == accum
        assert f"{p['losses'][-1] * accum:.4f}" == f"{printed[i]:.4f}"
    run = load_run(nanogpt["work"] / "run")
    try:
        assert run.status == "finished"
        assert run.meta["steps_from"].startswith("optimizer steps")
        s = run.steps.set_index("step")
        assert list(s.index) == sorted(printed)
        # the step's loss: the sum of what went to backward (each micro-batch loss / accum): their mean
        for i, p in enumerate(probe):
            assert s.loc[i, "loss"] == pytest.approx(sum(p["losses"]), rel=1e-5)
            assert s.loc[i, "loss"] == pytest.approx(printed[i], rel=0.1)  # nanoGPT's number, not half of it
            assert s.loc[i, "lr"] == pytest.approx(p["lr"], rel=1e-6) == _get_lr(i)
        tokens_per_iter = int(re.search(r"tokens per iteration will be: ([\d,]+)", out).group(1).replace(",", ""))
        assert (s["samples"] == CONFIG["batch_size"] * accum).all()
        assert (s["tokens"] == tokens_per_iter).all()
    finally:
        run.close()


def test_eval_and_checkpoint_are_phases_and_eval_loss_is_recorded(nanogpt: dict[str, Any]) -> None:
    evals = {int(i): (float(a), float(b)) for i, a, b in
             re.findall(r"^step (\d+): train loss (\S+), val loss (\S+)$", nanogpt["out"], re.M)}
    assert sorted(evals) == [0, 5, 10]
    run = load_run(nanogpt["work"] / "run")
    try:
        s = run.steps.set_index("step")
        assert s.loc[[0, 5, 10], "eval_s"].gt(0).all()
        assert s.drop(index=[0, 5, 10])["eval_s"].isna().all()
        assert s.loc[[5, 10], "checkpoint_s"].gt(0).all()  # nanoGPT saves from iteration 5 on
        assert s.drop(index=[5, 10])["checkpoint_s"].isna().all()
        ev = run.events[run.events["kind"] == "evaluation"]
        # nanoGPT's "step 5" evaluates the weights after 5 optimizer steps: step 4's (the initial ones at 0);
        # its time sits in the next row's eval_s (rows 0, 5, 10 above)
        assert ev["step"].tolist() == [0, 4, 9]
        assert [d["after_steps"] for d in ev["data"]] == [0, 5, 10]
        for after, data in zip([0, 5, 10], ev["data"], strict=True):
            train, val = evals[after]
            # the root module's losses under no_grad: eval_iters batches of each split, one mean of all, and
            # (--eval-splits train,val) each split's mean: the two numbers nanoGPT prints
            m = data["metrics"]
            assert m["eval_batches"] == 2 * CONFIG["eval_iters"]
            assert m["eval_loss"] == pytest.approx((train + val) / 2, abs=1e-4)
            assert f"{m['eval_loss_train']:.4f}" == f"{train:.4f}" and f"{m['eval_loss_val']:.4f}" == f"{val:.4f}"
        assert "unavailable_eval_splits" not in run.meta

        from gpudash.analysis.bottleneck import phase_shares

        shares = phase_shares(run.steps, run.meta).set_index("step")
        assert shares.loc[[0, 5, 10], "eval"].gt(0).all()  # eval time is its own, neither compute nor sync
        assert (shares[["input", "compute", "offload", "sync"]].sum(axis=1) <= 1.0 + 1e-9).all()
    finally:
        run.close()


def test_memory_categories_are_exact_from_step_0(nanogpt: dict[str, Any], zoo: Any) -> None:
    model = _model(nanogpt["work"], nanogpt["vocab"])
    params = zoo.storage_bytes(model.parameters())  # the tied embedding / head weight once
    n_tensors = len(list(model.parameters()))
    run = load_run(nanogpt["work"] / "run")
    try:
        mem = run.memory.set_index("step")
        assert (mem["params_bytes"] == params).all()
        assert (mem["trainable_params_bytes"] == params).all()
        # accumulation 2: the second micro-batch of every step runs with all gradients, step 0 included
        assert (mem["grads_bytes"] == params).all()
        assert mem.loc[0, "optimizer_bytes"] == 0  # no AdamW state before the first optimizer step
        assert (mem["optimizer_bytes"].drop(index=0) == 2 * params + 4 * n_tensors).all()
        assert run.meta["params_dtypes"] == {"float32": params}
    finally:
        run.close()
