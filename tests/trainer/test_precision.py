from __future__ import annotations

import math


def test_fp16_falls_back_to_fp32_after_injected_nans(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("fp16", steps=7, batch=4, precision="fp16", inject_nan_at_steps=(2, 3, 4), seq_len=32)
    assert r.status == "finished" and len(r.steps) == 7
    fb = r.events[r.events["kind"] == "precision_fallback"]
    assert len(fb) == 1
    assert int(fb["step"].iloc[0]) == 4
    assert fb["data"].iloc[0]["old"] == "fp16" and fb["data"].iloc[0]["lr_scale"] == 0.5
    nans = r.events[r.events["kind"] == "nan"]
    assert sorted(nans["step"].astype(int)) == [2, 3, 4]
    s = r.steps.set_index("step")
    assert s.loc[4, "skipped_steps"] == 3
    assert s.loc[0, "loss_scale"] == 2.0**16
    assert s.loc[4, "loss_scale"] < s.loc[1, "loss_scale"]  # the scaler backed off
    assert math.isnan(s.loc[5, "loss_scale"])  # fp32 from here on: no scaler
    # lr halved after the fallback: compare with the schedule of the plain run
    base = run_train("fp32", steps=7, batch=4, seq_len=32).steps.set_index("step")
    assert s.loc[6, "lr"] == base.loc[6, "lr"] * 0.5


def test_bf16_run_is_finite_and_says_its_plan(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("bf16", steps=3, batch=4, precision="bf16", seq_len=32)
    assert r.steps["loss"].notna().all() and (r.steps["skipped_steps"] == 0).all()
    assert "bf16" in r.meta["preflight"]["precision_strategy"]
    assert "fp32" in r.meta["preflight"]["fallback_plan"]


def test_nan_in_fp32_is_skipped_not_applied(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("nan32", steps=3, batch=4, inject_nan_at_steps=(1,), seq_len=32)
    assert list(r.events[r.events["kind"] == "nan"]["step"]) == [1]
    assert r.steps["skipped_steps"].iloc[-1] == 1
    assert r.steps["loss"].iloc[-1] == r.steps["loss"].iloc[-1]  # finite again after the skip


def test_fp16_loss_scale_below_the_floor_also_falls_back(run_train) -> None:  # type: ignore[no-untyped-def]
    from gpudash.trainer import TrainConfig

    r = run_train("floor", steps=3, batch=2, seq_len=16, precision="fp16", inject_nan_at_steps=(0,),
                  fallback_after=10, min_loss_scale=40000.0)
    fb = r.events[r.events["kind"] == "precision_fallback"]
    assert len(fb) == 1 and int(fb["step"].iloc[0]) == 0 and "below" in fb["data"].iloc[0]["reason"]
    assert TrainConfig(precision="fp16").fallback_after == 3
