"""The HF Trainer and Lightning callbacks resumed from a checkpoint into the same run: the second attempt's
steps continue at the framework's ``global_step``, each step is read once (issue 43)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402

STEPS = 6


def _check(run_dir: Path, resumed_at: int, source: str) -> None:
    run = load_run(run_dir)
    try:
        s = run.steps
        assert s["step"].tolist() == list(range(1, STEPS + 1))  # the framework's numbering, each step once
        assert s["attempt"].tolist() == [1] * (resumed_at - 1) + [2] * (STEPS - resumed_at + 1)
        ev = run.events[run.events["kind"] == "resume"]
        assert len(ev) == 1 and ev["data"].iloc[0]["step"] == resumed_at
        assert ev["data"].iloc[0]["step_from"] == source
    finally:
        run.close()


def test_hf_trainer_resumed_from_its_checkpoint(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from gpudash.integrations.hf import GpudashCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ids = torch.randint(0, 64, (48, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    run_dir = tmp_path / "runs" / "hf"

    def train(max_steps: int, resume: str | None) -> None:
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
        torch.manual_seed(0)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=4,
            report_to=[], save_strategy="steps", save_steps=3, use_cpu=True, disable_tqdm=True,
            dataloader_num_workers=0)
        trainer = transformers.Trainer(model=transformers.LlamaForCausalLM(cfg), args=args, train_dataset=Tokens(),
                                       callbacks=[GpudashCallback(run_dir, host_hz=0, handle_signals=False)])
        trainer.train(resume_from_checkpoint=resume)

    train(4, None)  # preempted after step 4; its last checkpoint is step 3
    train(STEPS, str(tmp_path / "out" / "checkpoint-3"))
    _check(run_dir, 4, "TrainerState.global_step (3)")


def test_lightning_resumed_from_its_checkpoint(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning.pytorch")
    from gpudash.integrations.lightning import GpudashCallback

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=8)
    run_dir = tmp_path / "runs" / "pl"
    ckpts = tmp_path / "ckpts"

    def fit(max_steps: int, ckpt: str | None) -> None:
        torch.manual_seed(0)
        saver = L.callbacks.ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=3, save_top_k=-1)
        trainer = L.Trainer(default_root_dir=str(tmp_path), accelerator="cpu", devices=1, max_steps=max_steps,
                            logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[saver, GpudashCallback(run_dir, host_hz=0, handle_signals=False)])
        trainer.fit(Tiny(), data, ckpt_path=ckpt)

    fit(4, None)
    saved = [p for p in ckpts.iterdir() if "step=3" in p.name]
    assert len(saved) == 1, sorted(p.name for p in ckpts.iterdir())
    fit(STEPS, str(saved[0]))
    _check(run_dir, 4, "Lightning's trainer.global_step (3)")
