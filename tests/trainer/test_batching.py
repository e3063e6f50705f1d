from __future__ import annotations

import pytest

from gpudash.trainer.batching import AdaptiveBatch

SAME_SHAPE = {"seq_len": 64, "min_len": 64}


def _events(r, kind: str):  # type: ignore[no-untyped-def]
    return r.events[r.events["kind"] == kind]


def test_injected_oom_recovers_every_step_with_the_same_effective_batch(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("oom", steps=6, batch=8, inject_oom_at_batch=8, **SAME_SHAPE)
    assert r.status == "finished"
    assert r.steps["step"].tolist() == list(range(6))  # every step finished
    assert (r.steps["batch_size"] == 8).all()  # effective batch kept...
    assert (r.steps["micro_batch"] == 6).all() and (r.steps["micro_steps"] == 2).all()  # ...by accumulation
    ooms = _events(r, "oom")
    assert len(ooms) == 1 and int(ooms["step"].iloc[0]) == 0
    data = ooms["data"].iloc[0]
    assert data["bytes_before"] > 0 and data["leaked_bytes"] == 0 and data["bytes_after"] == data["bytes_before"]
    change = _events(r, "batch_size_change")["data"].iloc[0]
    assert (change["old"], change["new"], change["effective"]) == (8, 6, 8)


def test_recovered_run_matches_the_loss_of_a_run_that_never_ooms(run_train) -> None:  # type: ignore[no-untyped-def]
    ok = run_train("ok", steps=3, batch=8, **SAME_SHAPE).steps["loss"].to_numpy()
    rec = run_train("rec", steps=3, batch=8, inject_oom_at_batch=7, **SAME_SHAPE).steps["loss"].to_numpy()
    assert rec == pytest.approx(ok, rel=1e-5)


def test_memory_budget_raises_real_ooms_on_cpu_and_the_run_shrinks_to_fit(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("budget", steps=4, batch=16, memory_budget_gb=0.015, **SAME_SHAPE)
    assert r.status == "finished" and len(r.steps) == 4
    ooms = _events(r, "oom")
    assert len(ooms) >= 1
    assert all("memory budget exceeded" in m for m in ooms["message"])
    assert all(d["leaked_bytes"] == 0 for d in ooms["data"])
    assert (r.steps["batch_size"] == 16).all()
    assert r.steps["micro_batch"].iloc[-1] < 16
    assert r.memory["peak_bytes"].max() <= 0.015 * 2**30


def test_auto_batch_starts_from_the_estimate_and_grows_with_headroom(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("auto", steps=12, batch="auto", effective_batch=32, memory_budget_gb=0.04, **SAME_SHAPE)
    start = r.meta["preflight"]["start_micro_batch"]
    assert 1 <= start < 32
    grows = _events(r, "batch_size_change")
    assert len(grows) >= 1 and grows["data"].iloc[0]["reason"] == "headroom"
    assert r.steps["micro_batch"].iloc[-1] > start
    assert (r.steps["batch_size"] == 32).all()


def test_controller_rules() -> None:
    b = AdaptiveBatch(effective=20, start=10, adaptive=True, grow_every=2)
    assert b.plan() == 2
    assert b.maybe_grow(peak=10, capacity=100) is None  # not enough good steps yet
    assert b.maybe_grow(peak=10, capacity=100) == 12  # x1.2
    assert b.maybe_grow(peak=80, capacity=100) is None  # above 70 %
    assert b.shrink() == 9  # x0.8
    b.micro = 1
    assert b.shrink() is None
    fixed = AdaptiveBatch(effective=8, start=8, adaptive=False)
    assert fixed.maybe_grow(peak=1, capacity=100) is None
