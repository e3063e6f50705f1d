"""GpudashCallback with a real lightning.pytorch.Trainer on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from gpudash import load_run  # noqa: E402
from gpudash.integrations.lightning import GpudashCallback  # noqa: E402
from gpudash.monitor.timing import NOWHERE  # noqa: E402

STEPS = 5


class Tiny(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _loader() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, 10 * x[:, :1]), batch_size=8)


def _fit(root: Path, callback: GpudashCallback, **kwargs: Any) -> Tiny:
    torch.manual_seed(0)
    model = Tiny()
    trainer = L.Trainer(default_root_dir=str(root), accelerator="cpu", devices=1, max_steps=STEPS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback], **kwargs)
    trainer.fit(model, _loader())
    return model


def test_lightning_steps_loss_lr_grad_norm_memory(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "pl"
    model = _fit(tmp_path, GpudashCallback(run_dir, host_hz=0, handle_signals=False),
                 accumulate_grad_batches=2, gradient_clip_val=0.01)
    run = load_run(run_dir)
    assert run.status == "finished"
    s = run.steps
    assert list(s["step"]) == list(range(1, STEPS + 1))  # Lightning's global_step
    assert run.meta["first_step"] == 1
    assert (s["samples"] == 16).all()  # two micro-batches of 8
    assert "tokens" not in s or s["tokens"].isna().all()  # float features: no tokens
    for phase in ("data_s", "forward_s", "backward_s", "optimizer_s"):
        assert (s[phase] > 0).all(), phase
    assert (s["data_s"] + s["forward_s"] + s["backward_s"] + s["optimizer_s"] <= s["duration_s"]).all()
    # loss: the mean of training_step's two losses in each optimizer step
    pairs = [sum(model.losses[2 * i: 2 * i + 2]) / 2 for i in range(STEPS)]
    assert list(s["loss"]) == pytest.approx(pairs, rel=1e-5)
    assert list(s["lr"]) == pytest.approx([0.1 * 0.5**i for i in range(STEPS)])  # the rate each step used
    assert (s["grad_norm"] > 0.01).all()  # measured before clipping to 0.01
    mem = run.memory
    n_params = sum(p.numel() for p in model.parameters())
    assert (mem["params_bytes"] == 4 * n_params).all()
    assert (mem["trainable_params_bytes"] == 4 * n_params).all()
    assert (mem["grads_bytes"] == 4 * n_params).all()
    assert run.meta["config"]["framework"] == "lightning"
    assert run.meta["config"]["accumulate_grad_batches"] == 2
    assert run.meta["total_steps"] == STEPS  # estimated_stepping_batches: optimizer steps, not batches
    run.close()


def test_default_run_dir(tmp_path: Path) -> None:
    _fit(tmp_path, GpudashCallback(host_hz=0, handle_signals=False, grad_norm=False))
    run = load_run(tmp_path / "gpudash")
    assert len(run.steps) == STEPS and "grad_norm" not in run.steps
    assert (run.steps["samples"] == 8).all()
    run.close()


def test_validation_is_outside_every_step(tmp_path: Path) -> None:
    class WithVal(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            mon = cb.monitor
            assert mon is None or mon._row is NOWHERE  # no step is open while validating (None: sanity check)
            checked.append(mon is not None)
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            if mon is not None:
                val_losses.setdefault(self.global_step, []).append(float(loss))
            self.log("val_loss", loss)
            self.log("val_mae", torch.nn.functional.l1_loss(self.net(batch[0]), batch[1]))

    checked: list[bool] = []
    val_losses: dict[int, list[float]] = {}
    cb = GpudashCallback(tmp_path / "val", host_hz=0, handle_signals=False)
    torch.manual_seed(0)
    trainer = L.Trainer(default_root_dir=str(tmp_path), accelerator="cpu", devices=1, max_steps=6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[cb], val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=1)
    trainer.fit(WithVal(), _loader(), _loader())
    assert checked.count(True) == 3 * 2  # validation after steps 2, 4, 6: two batches each
    run = load_run(tmp_path / "val")
    assert list(run.steps["step"]) == list(range(1, 7))
    assert (run.steps["data_s"] > 0).all()
    # each validation is one event with what it logged (not training's metrics), the last one too
    evals = run.events[run.events["kind"] == "evaluation"]
    assert evals["step"].tolist() == [2, 4, 6] == sorted(val_losses)
    for step, data in zip(evals["step"], evals["data"], strict=True):
        assert set(data["metrics"]) == {"val_loss", "val_mae"}
        assert data["metrics"]["val_loss"] == pytest.approx(sum(val_losses[step]) / len(val_losses[step]), rel=1e-5)
    run.close()
