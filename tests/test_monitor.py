"""The Monitor around a real CPU training loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.collectors.categories import CategoryCollector


def test_real_loop_records_steps_phases_scalars_memory(tmp_path: Path, train_tiny: Any) -> None:
    train_tiny(tmp_path / "r", steps=30)
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "finished" and run.meta["end_reason"] == "closed"
    s = run.steps
    assert s["step"].tolist() == list(range(30))
    for col in ("time", "duration_s", "data_s", "forward_s", "backward_s", "optimizer_s", "loss", "lr",
                "samples", "tokens"):
        assert col in s and s[col].notna().all(), col
    phases = s[["data_s", "forward_s", "backward_s", "optimizer_s"]].sum(axis=1)
    assert (phases <= s["duration_s"] + 1e-9).all()
    assert s["time"].is_monotonic_increasing
    m = run.memory
    n_params = (32 * 64 + 64) + (64 * 4 + 4)
    assert (m["params_bytes"] == n_params * 4).all()
    assert (m["grads_total_bytes"] == n_params * 4).all()  # read after backward, before zero_grad
    # at the step's peak (its forward) zero_grad(set_to_none=True) had freed them: the stack leaves them out
    assert (m["grads_bytes"] == 0).all()
    assert (m["optimizer_bytes"].iloc[1:] >= 2 * n_params * 4).all()  # Adam moments
    act = m["activations_bytes"].dropna()
    assert len(act) >= 1 and (act > 0).all()
    per_module = run.activations
    assert set(per_module["module"]) >= {"0", "1"}  # Linear 2 saves ReLU 1's output: counted once, at 1


def test_activation_sampling_spreads_out_by_steps(tmp_path: Path, train_tiny: Any) -> None:
    mon = train_tiny(tmp_path / "r", steps=40, close=False, activations_budget=0.0001)
    cat = next(c for c in mon.collectors if isinstance(c, CategoryCollector))
    assert cat.act_sampler.cap == 1024  # a tiny budget spreads the measured steps of a long run further out
    mon.close()
    m = gpudash.load_run(tmp_path / "r").memory
    measured = m.loc[m["activations_bytes"].notna()]
    # the 8 steps after the first, then gaps that double; each row says the gap to the next measured step
    assert measured["step"].tolist() == [*range(1, 9), 16, 32]
    assert measured["activations_every"].tolist() == [1] * 7 + [8, 16, 32]


def test_collector_errors_never_reach_the_loop(tmp_path: Path, train_tiny: Any) -> None:
    mon = gpudash.Monitor(tmp_path / "r")

    def broken(step: int, row: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    mon.add_step_hooks(end=broken)
    for _ in range(3):
        with mon.step():
            pass
    mon.close()
    run = gpudash.load_run(tmp_path / "r")
    assert len(run.steps) == 3
    ev = run.events[run.events["message"].str.startswith("broken:")]
    assert len(ev) == 1 and "boom" in ev["message"].iloc[0] and ev["kind"].iloc[0] == "collector_unavailable"


def test_a_hook_removed_mid_step_skips_no_other_hook(tmp_path: Path) -> None:
    """A failing hook is removed while the step runs its hooks: the one after it still runs that step."""
    seen: list[int] = []

    def broken_start(step: int) -> None:
        raise RuntimeError("boom")

    def broken_end(step: int, row: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    def after(step: int, row: dict[str, Any]) -> None:
        seen.append(step)

    with gpudash.Monitor(tmp_path / "r", host_hz=0) as mon:
        mon.add_step_hooks(start=broken_start, end=broken_end)
        mon.add_step_hooks(start=lambda step: seen.append(-1 - step), end=after)
        for _ in range(3):
            with mon.step():
                pass
    assert seen == [-1, 0, -2, 1, -3, 2]


def test_a_due_hook_runs_at_the_steps_it_asks_for_only(tmp_path: Path) -> None:
    """An ``end_due`` hook (a sampler) is called at the steps it returns, never at a failed one; one that raises is
    removed and recorded, and the steps go on."""
    called: list[int] = []

    def every_third(step: int, row: dict[str, Any]) -> int:
        called.append(step)
        assert row["step"] == step and "duration_s" in row
        return step + 3

    def broken(step: int, row: dict[str, Any]) -> int:
        raise RuntimeError("boom")

    with gpudash.Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0) as mon:
        mon.add_step_hooks(end_due=every_third)
        mon.add_step_hooks(end_due=broken)
        for i in range(10):
            if i == 3:
                with pytest.raises(ValueError), mon.step():  # the step it asked for fails: the next one is read
                    raise ValueError("retry")
            with mon.step():
                pass
    assert called == [0, 3, 6, 9]
    run = gpudash.load_run(tmp_path / "r")
    assert len(run.steps) == 10
    assert (run.events["message"].str.startswith("broken:")).sum() == 1


def test_events_meta_and_log_outside_a_step(tmp_path: Path) -> None:
    with gpudash.Monitor(tmp_path / "r", name="exp") as mon:
        mon.set_meta(config={"batch": 4})
        mon.log(lr=0.5)  # outside a step: goes to the next step
        with mon.step(samples=4):
            mon.event("batch_size_change", "4 -> 3", old=4, new=3)
    run = gpudash.load_run(tmp_path / "r")
    assert run.name == "exp"
    assert run.meta["config"] == {"batch": 4}
    assert run.steps["lr"].tolist() == [0.5]
    ev = run.events[run.events["kind"] == "batch_size_change"].iloc[0]
    assert ev["kind"] == "batch_size_change" and ev["data"] == {"old": 4, "new": 3} and ev["step"] == 0


def test_failed_step_is_not_counted(tmp_path: Path) -> None:
    mon = gpudash.Monitor(tmp_path / "r")
    for i in range(3):
        try:
            with mon.step():
                if i == 1:
                    raise MemoryError("retry me")
        except MemoryError:
            pass
    mon.close()
    assert gpudash.load_run(tmp_path / "r").steps["step"].tolist() == [0, 1]


def test_import_gpudash_does_not_import_torch_or_dash() -> None:
    import subprocess
    import sys

    code = "import sys, gpudash; gpudash.load_run; print('torch' in sys.modules, 'dash' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_activations_under_accumulation_are_the_largest_micro_batch(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def record(run_dir: Path, micro: int) -> float:
        mon = gpudash.Monitor(run_dir, activations_every=1)
        mon.watch(model, opt)
        for _ in range(3):
            with mon.step():
                for _ in range(micro):
                    with mon.phase("forward"):
                        loss = model(torch.randn(64, 32)).square().mean()
                    with mon.phase("backward"):
                        loss.backward()
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
        mon.close()
        return float(gpudash.load_run(run_dir).memory["activations_bytes"].dropna().iloc[-1])

    one = record(tmp_path / "one", 1)
    four = record(tmp_path / "four", 4)
    assert one > 0 and four == one  # 4 micro-batches in a row never hold more than one at a time


def test_unwritable_run_dir_is_one_clear_error(tmp_path: Path) -> None:
    import pytest

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(gpudash.RunError, match="cannot record a run here.*writable run directory"):
        gpudash.Monitor(blocker / "run")


def test_a_one_value_cpu_tensor_is_read_as_it_is_logged(tmp_path: Path) -> None:
    """Issue 41: a CPU loss tensor logged is read at once (no device to wait for): the queued row holds a float,
    not the tensor (and its storage) until the writer's next flush. Other tensors are detached and read there."""
    torch = pytest.importorskip("torch")
    seen: list[dict[str, Any]] = []
    with gpudash.Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0) as mon:
        put = mon._put_step
        mon._put_step = lambda row: (seen.append(row), put(row))  # type: ignore[method-assign]
        w = torch.ones(3, requires_grad=True)
        with mon.step():
            loss = (w * 2).sum()
            mon.log(loss=loss, vec=torch.arange(2.0), half=torch.tensor(0.5, dtype=torch.bfloat16))
    row = seen[0]
    assert type(row["loss"]) is float and row["loss"] == 6.0 and type(row["half"]) is float
    assert isinstance(row["vec"], torch.Tensor) and not row["vec"].requires_grad
    assert None in row  # marked: a row holding a tensor is never packed (packing would call its __float__)
    assert gpudash.load_run(tmp_path / "r").steps["loss"].tolist() == [6.0]


def test_a_memory_record_is_written_at_its_steps_end_with_no_hook_to_run(tmp_path: Path) -> None:
    """A step with nothing to run ends in one comparison (``Monitor._slow_from``); a memory record logged in a step,
    or between steps for the next one, still makes that step's end write it, and the steps after go back to the
    short path."""
    import sqlite3

    mon = gpudash.Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0)
    for i in range(6):
        with mon.step():
            if i in (1, 3):
                mon.log_memory(offload_bytes=100 * i)
        if i == 3:
            mon.log_memory(offload_bytes=7)  # between steps: the next step's record
        if i == 5:
            assert mon._slow_from > i  # nothing left to run: the short path again
    mon.close()
    with sqlite3.connect(tmp_path / "r" / "rank0.db") as conn:
        got = conn.execute("SELECT step, offload_bytes FROM memory ORDER BY step").fetchall()
        steps = [s for (s,) in conn.execute("SELECT step FROM steps ORDER BY step")]
    assert got == [(1, 100.0), (3, 300.0), (4, 7.0)] and steps == list(range(6))
