"""The agent in-process: what the hooks make of a training loop the script writes itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402
from gpudash.commands.run import child_env, default_run_name  # noqa: E402
from gpudash.options import MonitorOptions  # noqa: E402
from gpudash.zerocode.agent import NARROW_AFTER, Agent  # noqa: E402


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    a = Agent(str(tmp_path / "run"), {"host_hz": 0, "handle_signals": False})
    a.install(torch)
    yield a
    a.stop()


def test_grad_scaler_loss_is_logged_unscaled_and_two_optimizers_make_one_step(agent: Agent, tmp_path: Path) -> None:
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.Adam(disc.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    losses = []
    for _ in range(3):
        x = torch.randn(5, 4)
        loss = disc(gen(x)).pow(2).mean()
        losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.step(opt_g)  # the primary: the first optimizer seen stepping
        scaler.step(opt_d)
        scaler.update()
        opt_g.zero_grad()
        opt_d.zero_grad()
    agent.stop()
    run = load_run(tmp_path / "run")
    s = run.steps
    assert list(s["step"]) == [0, 1, 2]
    assert list(s["loss"]) == pytest.approx(losses)  # not 1024 x the loss
    assert (s["samples"] == 5).all()
    assert list(s["lr"]) == pytest.approx([0.1] * 3)
    run.close()


def test_eval_is_a_phase_and_nested_modules_open_no_steps(agent: Agent, tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch.no_grad():
        model(torch.randn(2, 3))  # evaluation before training: recorded in step 0's eval phase
    assert agent.monitor is not None
    for i in range(4):  # past NARROW_AFTER: the hooks move from every module to the roots seen
        model(torch.randn(6 + i, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert NARROW_AFTER < 4 and agent._roots is None
    model.eval()
    model(torch.randn(50, 3))  # after the last step: not a step, not counted as samples
    agent.stop()
    run = load_run(tmp_path / "run")
    assert list(run.steps["step"]) == [0, 1, 2, 3]
    assert list(run.steps["samples"]) == [6, 7, 8, 9]
    assert (run.steps["forward_s"] > 0).all()
    assert run.steps["eval_s"].iloc[0] > 0 and run.steps["eval_s"].iloc[1:].isna().all()
    assert (run.memory["params_bytes"] == 4 * (3 * 8 + 8 + 8 + 1)).all()
    assert (run.memory["trainable_params_bytes"] == run.memory["params_bytes"]).all()
    assert (run.memory["optimizer_bytes"] == 0).all()  # plain SGD keeps no state
    assert run.meta["steps_from"].startswith("optimizer steps")
    run.close()


def test_a_failing_hook_stops_recording_but_not_training(agent: Agent, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()

    def broken(*args: object) -> None:
        raise ValueError("boom")

    agent.driver.end_step = broken
    model(torch.randn(2, 3)).sum().backward()
    opt.step()  # the post hook fails inside gpudash
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    err = capsys.readouterr().err
    assert err.count("gpudash: stopped recording after an internal error (ValueError: boom)") == 1
    assert not agent.active and agent.stopped
    run = load_run(tmp_path / "run")
    assert list(run.steps["step"]) == [0]
    run.close()


def test_run_name_and_child_environment(tmp_path: Path) -> None:
    assert default_run_name(["python", "scripts/train.py", "--lr", "1"], 0).startswith("train-")
    assert default_run_name(["python", "-m", "pkg.finetune"], 0).startswith("finetune-")
    assert default_run_name(["torchrun", "--nproc-per-node", "2", "ddp.py"], 0).startswith("ddp-")
    assert default_run_name(["./run.sh"], 0).startswith("run.sh-")
    env = child_env({"PYTHONPATH": "/a" + os.pathsep + "/b", "KEEP": "1"}, tmp_path, MonitorOptions(snapshot_every=5))
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0].endswith(os.path.join("zerocode", "_boot")) and parts[1:3] == ["/a", "/b"]
    assert env["KEEP"] == "1" and env["GPUDASH_RUN_DIR"] == str(tmp_path)
    assert env["GPUDASH_RUN_OPTIONS"] == '{"snapshot_every": 5}'


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, monitor: object = None) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ctx = monitor.step(samples=8) if monitor is not None else None  # type: ignore[attr-defined]
        if ctx is not None:
            ctx.__enter__()
        for _ in range(2):  # two micro-batches
            x = torch.randn(8, 6, generator=g)
            if monitor is not None:
                with monitor.phase("forward"):  # type: ignore[attr-defined]
                    loss = model(x).pow(2).mean() / 2
                with monitor.phase("backward"):  # type: ignore[attr-defined]
                    loss.backward()
            else:
                (model(x).pow(2).mean() / 2).backward()
        opt.step()
        opt.zero_grad()
        if ctx is not None:
            ctx.__exit__(None, None, None)


def test_step_0_is_what_an_explicit_monitor_records(agent: Agent, tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    def model_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-2)

    model, opt = model_opt()
    _train(model, opt, 3)
    agent.stop()
    agent.uninstall()
    model, opt = model_opt()
    with Monitor(tmp_path / "explicit", host_hz=0, handle_signals=False) as mon:
        mon.watch(model, opt)
        _train(model, opt, 3, mon)
    cols = ["step", "params_bytes", "trainable_params_bytes", "grads_bytes", "grads_total_bytes", "optimizer_bytes"]
    zero, explicit = load_run(tmp_path / "run"), load_run(tmp_path / "explicit")
    try:
        assert zero.memory[cols].to_dict("records") == explicit.memory[cols].to_dict("records")
        row0 = zero.memory.iloc[0]
        assert row0["grads_bytes"] == row0["params_bytes"] and row0["optimizer_bytes"] == 0
    finally:
        zero.close()
        explicit.close()


def test_a_run_without_a_step_says_why(agent: Agent, tmp_path: Path) -> None:
    from gpudash.analysis.facts import run_facts
    from gpudash.analysis.summary import summarize
    from gpudash.commands.info import summarize as info_lines

    model = torch.nn.Linear(4, 2)
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            torch.nn.functional.mse_loss(model(torch.randn(5, 4)), torch.zeros(5, 2))
            model(torch.randn(5, 4))
    agent.stop()
    run = load_run(tmp_path / "run")
    try:
        assert run.status == "finished" and len(run.steps) == 0
        why = run.meta["no_steps_reason"]
        assert why.startswith("no backward() ran: the script only evaluated")
        assert run.events[run.events["kind"] == "no_steps"]["message"].tolist() == [why]
        assert run_facts(run).no_steps_reason == why
        assert any(line.startswith("no steps") and why in line for line in info_lines(run))
        status = summarize(run)[0]
        assert status.title == "Finished without a step" and status.severity == "warn" and why in status.evidence
    finally:
        run.close()


def test_eval_splits_name_consecutive_equal_groups_of_batches() -> None:
    from gpudash.zerocode.evals import eval_metrics

    losses = [torch.tensor(v) for v in (1.0, 2.0, 3.0, 5.0, 7.0, 9.0)]
    assert eval_metrics(losses) == {"eval_loss": pytest.approx(27 / 6), "eval_batches": 6}
    split = eval_metrics(losses, ("train", "val"))
    assert split["eval_loss_train"] == pytest.approx(2.0) and split["eval_loss_val"] == pytest.approx(7.0)
    assert split["eval_loss"] == pytest.approx(27 / 6)  # the mean of all stays what it was
    uneven = eval_metrics(losses[:5], ("train", "val"))  # no guess: said, and only the mean of all
    assert "eval_loss_train" not in uneven and uneven["eval_splits"] == "5 batches do not split into 2 equal groups " \
        "(train,val)"
    assert eval_metrics([], ("train", "val")) == {}


@pytest.mark.parametrize("bad", [("train", "train"), ("a b",), ("x",) * 9, ("",), (3,)])
def test_eval_splits_are_a_few_different_names(bad: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="eval_splits must be"):
        MonitorOptions(eval_splits=bad)  # type: ignore[arg-type]


class _WithLoss(torch.nn.Module):
    """Returns ``(logits, loss)`` as nanoGPT's GPT does."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x: Any, y: Any) -> tuple[Any, Any]:
        out = self.lin(x)
        return out, torch.nn.functional.mse_loss(out, y)


def test_eval_splits_from_the_options_and_an_uneven_eval_said_once(tmp_path: Path) -> None:
    agent = Agent(str(tmp_path / "run"), {"host_hz": 0, "handle_signals": False, "eval_splits": ["train", "val"]})
    agent.install(torch)
    model = _WithLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for batches in (4, 3, 3):  # four batches: two groups of two; three: not two equal groups
            model(torch.randn(4, 3), torch.zeros(4, 1))[1].backward()
            opt.step()
            opt.zero_grad()
            model.eval()
            with torch.no_grad():
                for _ in range(batches):
                    model(torch.randn(4, 3), torch.zeros(4, 1))
            model.train()
    finally:
        agent.stop()
    run = load_run(tmp_path / "run")
    metrics = [d["metrics"] for d in run.events.loc[run.events["kind"] == "evaluation", "data"]]
    assert [m["eval_batches"] for m in metrics] == [4, 3, 3]
    assert {"eval_loss_train", "eval_loss_val"} <= set(metrics[0]) and "eval_loss_train" not in metrics[1]
    assert "do not split into 2 equal groups" in run.meta["unavailable_eval_splits"]
    said = run.events[run.events["kind"] == "collector_unavailable"]
    assert len(said[said["message"].str.startswith("eval_splits")]) == 1


def test_an_optimizer_made_that_never_steps_is_given_up(agent: Agent, tmp_path: Path) -> None:
    """A second optimizer over other weights is waited for in the first iteration (a GAN's); one that never
    steps is given up when the first steps again: every step still counted, each with its own loss and batch."""
    torch.manual_seed(0)
    model, other = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idle = torch.optim.SGD(other.parameters(), lr=0.1)  # made, never stepped  # noqa: F841
    losses = []
    for _ in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    agent.stop()
    run = load_run(tmp_path / "run")
    s = run.steps
    assert list(s["step"]) == [0, 1, 2, 3]
    assert list(s["loss"]) == pytest.approx(losses)
    assert (s["samples"] == 8).all()
    run.close()
