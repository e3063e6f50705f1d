"""GpudashCallback with a real transformers.Trainer on CPU: a tiny Llama built from a config."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402
from gpudash.analysis.facts import run_facts  # noqa: E402
from gpudash.integrations.hf import GpudashCallback  # noqa: E402
from gpudash.monitor.timing import NOWHERE  # noqa: E402

STEPS = 6


class _Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _tiny_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _train(tmp_path: Path, **args: object) -> tuple[Path, object]:
    run_dir = tmp_path / "runs" / "hf"
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-3,
        lr_scheduler_type="linear", warmup_steps=0, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, **args)
    trainer = transformers.Trainer(model=_tiny_llama(), args=targs, train_dataset=_Tokens(64, 16, 128),
                                   callbacks=[GpudashCallback(run_dir, host_hz=0, handle_signals=False)])
    trainer.train()
    return run_dir, trainer


def test_trainer_steps_loss_lr_memory(tmp_path: Path) -> None:
    run_dir, trainer = _train(tmp_path, logging_steps=2, gradient_accumulation_steps=2)
    run = load_run(run_dir)
    assert run.status == "finished"
    s = run.steps
    assert list(s["step"]) == list(range(1, STEPS + 1))  # the Trainer's global_step: the same number, the same step
    assert run_facts(run).steps == STEPS and run.meta["first_step"] == 1
    assert (s["samples"] == 8).all() and (s["tokens"] == 8 * 16).all()  # 2 micro-batches of 4 x 16
    for phase in ("data_s", "forward_s", "backward_s", "optimizer_s"):
        assert (s[phase] > 0).all(), phase
    assert (s["data_s"] + s["forward_s"] + s["backward_s"] + s["optimizer_s"] <= s["duration_s"]).all()
    assert s["loss"].notna().all() and (s["loss"] > 0).all()
    assert s["loss"].iloc[0] == pytest.approx(float(torch.log(torch.tensor(128.0))), rel=0.1)
    # linear decay from 1e-3: the rate each step used
    assert list(s["lr"]) == pytest.approx([1e-3 * (1 - i / STEPS) for i in range(STEPS)])
    logged = s[s["grad_norm"].notna()]
    assert list(logged["step"]) == [2, 4, 6]  # logging_steps=2: global steps 2, 4, 6
    assert (logged["log_s"] > 0).all()
    # the Trainer's own numbers: loss averaged over each logging window, grad_norm of the logged step
    history = [h for h in trainer.state.log_history if "grad_norm" in h]  # type: ignore[attr-defined]
    assert [h["step"] for h in history] == [2, 4, 6]
    for h, (_, row) in zip(history, logged.iterrows(), strict=True):
        assert row["grad_norm"] == pytest.approx(h["grad_norm"])
        window = s[(s["step"] > h["step"] - 2) & (s["step"] <= h["step"])]
        assert window["loss"].mean() == pytest.approx(h["loss"], rel=1e-4)
    mem = run.memory
    n_params = sum(p.numel() for p in _tiny_llama().parameters())
    assert (mem["params_bytes"] == 4 * n_params).all()
    assert (mem["trainable_params_bytes"] == 4 * n_params).all()
    assert (mem["grads_bytes"] == 4 * n_params).all()
    assert (mem["optimizer_bytes"].iloc[1:] >= 8 * n_params).all()  # AdamW moments once it stepped
    assert run.meta["config"]["framework"] == "transformers"
    assert run.meta["config"]["gradient_accumulation_steps"] == 2
    # the architecture, so the OOM advice can estimate LoRA/QLoRA mixes for this model and not a GPT stand-in
    arch = run.meta["config"]["model_config"]
    assert arch["model_type"] == "llama" and arch["hidden_size"] == _tiny_llama().config.hidden_size
    assert run.meta["total_steps"] == STEPS  # state.max_steps: progress and ETA on every surface
    run.close()


def test_default_run_dir_and_user_monitor(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    targs = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, report_to=[],
                                           per_device_train_batch_size=2, save_strategy="no", use_cpu=True,
                                           disable_tqdm=True)
    transformers.Trainer(model=_tiny_llama(), args=targs, train_dataset=_Tokens(8, 8, 128),
                         callbacks=[GpudashCallback(host_hz=0, handle_signals=False)]).train()
    run = load_run(tmp_path / "out" / "gpudash")
    assert list(run.steps["step"]) == [1, 2] and run.status == "finished"
    run.close()
    with Monitor(tmp_path / "mine", host_hz=0, handle_signals=False) as m:
        transformers.Trainer(model=_tiny_llama(), args=targs, train_dataset=_Tokens(8, 8, 128),
                             callbacks=[GpudashCallback(m)]).train()
        assert not m.closed  # the user's Monitor stays open
    run = load_run(tmp_path / "mine")
    assert len(run.steps) == 2 and run.meta["hf_config"]["framework"] == "transformers"
    run.close()


def test_train_again_after_a_crash_drops_the_broken_step(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    class Boom(transformers.TrainerCallback):  # type: ignore[misc]
        armed = True

        def on_step_end(self, args: object, state: object, control: object, **kw: object) -> None:
            if self.armed and state.global_step == 3:  # type: ignore[attr-defined]
                raise RuntimeError("boom")

    targs = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, report_to=[],
                                           per_device_train_batch_size=2, save_strategy="no", use_cpu=True,
                                           disable_tqdm=True)
    boom = Boom()
    with Monitor(tmp_path / "again", host_hz=0, handle_signals=False) as m:
        trainer = transformers.Trainer(model=_tiny_llama(), args=targs, train_dataset=_Tokens(8, 8, 128),
                                       callbacks=[boom, GpudashCallback(m)])
        with pytest.raises(RuntimeError, match="boom"):
            trainer.train()  # the third step never reaches our on_step_end
        boom.armed = False
        trainer.train()
    run = load_run(tmp_path / "again")
    assert list(run.steps["step"]) == [0, 1, 2, 3, 4]  # 2 + 3 steps, the broken one dropped
    run.close()


def test_evaluation_is_outside_every_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "eval"
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=True, eval_strategy="steps", eval_steps=2,
        per_device_eval_batch_size=2)
    seen: list[int] = []

    class Probe(transformers.TrainerCallback):  # type: ignore[misc]
        # listed before GpudashCallback: sees the state at the end of the evaluation
        def on_evaluate(self, args: object, state: object, control: object, **kw: object) -> None:
            seen.append(monitor.step_index if (monitor := cb.monitor) is not None else -1)
            assert monitor is not None and monitor._row is NOWHERE  # no step is open while evaluating

    cb = GpudashCallback(run_dir, host_hz=0, handle_signals=False)
    trainer = transformers.Trainer(model=_tiny_llama(), args=targs, train_dataset=_Tokens(16, 8, 128),
                                   eval_dataset=_Tokens(4, 8, 128), callbacks=[Probe(), cb])
    trainer.train()
    assert seen == [3, 5]  # evaluating after global steps 2 and 4: no step open (the index is the next one)
    final = trainer.evaluate()  # after train() returned: recorded too
    run = load_run(run_dir)
    assert run.status == "finished"
    s = run.steps
    assert list(s["step"]) == [1, 2, 3, 4]
    assert (s["data_s"] > 0).all()
    # every evaluation is one event at the global step it ran after, the one after the last step too
    evals = run.events[run.events["kind"] == "evaluation"]
    history = [h for h in trainer.state.log_history if "eval_loss" in h]  # type: ignore[attr-defined]
    assert [h["step"] for h in history] == [2, 4, 4]
    assert evals["step"].tolist() == [2, 4, 4]
    assert evals["data"].iloc[-1]["metrics"]["eval_loss"] == pytest.approx(final["eval_loss"])
    for h, data in zip(history, evals["data"], strict=True):
        assert data["metrics"]["eval_loss"] == pytest.approx(h["eval_loss"])
        assert set(data["metrics"]) >= {"eval_loss", "eval_runtime"}
    assert "eval_loss" in evals["message"].iloc[-1]
    assert "eval_loss" not in s  # not in a step's row: evaluation is between steps
    run.close()
