"""One memory story: each memory row's categories never add up to more than the step's measured
peak (``peak_bytes``), and the estimator, predicting each step at its batch's real shape, lands
within 10 % of it."""

from __future__ import annotations

import gpudash
from gpudash.analysis.memory import memory_verdicts

CATS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
# variable-length batches (min_len < seq_len) under the CPU budget meter, which measures the peak
VARIABLE = {"steps": 10, "seq_len": 64, "min_len": 8, "memory_budget_gb": 1.0}


def _story(r: gpudash.Run) -> None:
    mem = r.memory
    assert mem["peak_bytes"].notna().all()
    total = mem[list(CATS)].fillna(0).sum(axis=1)
    assert (total <= mem["peak_bytes"]).all(), mem[[*CATS, "peak_bytes"]]
    sampled = mem["activations_bytes"].notna()
    assert sampled.sum() >= 3
    # on sampled steps the categories account for the measured peak
    assert (total[sampled] >= 0.97 * mem.loc[sampled, "peak_bytes"]).all()
    steady = mem[mem["step"] > 0]
    err = (steady["predicted_peak_bytes"] / steady["peak_bytes"] - 1).abs()
    assert err.median() <= 0.10, err.tolist()
    check = [v for v in memory_verdicts(r) if v.kind == "estimate-check"]
    assert len(check) == 1 and abs(check[0].numbers["error"]) <= 0.10 and check[0].severity == "ok"


def test_one_micro_batch_per_step(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("one", batch=4, effective_batch=4, **VARIABLE)
    assert (r.steps["micro_steps"] == 1).all()
    _story(r)
    assert (r.memory["grads_bytes"] == 0).all()  # freed by zero_grad before the forward that peaks
    assert (r.memory["grads_total_bytes"] > 0).all()


def test_gradient_accumulation(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("accum", batch=2, effective_batch=6, **VARIABLE)
    assert (r.steps["micro_steps"] == 3).all()
    _story(r)
    # later micro-batches run on top of the accumulated gradients
    assert (r.memory["grads_bytes"] == r.memory["grads_total_bytes"]).all()


def test_trainer_records_each_oom_once_through_record_oom(run_train) -> None:  # type: ignore[no-untyped-def]
    from gpudash.analysis.oom import oom_reports

    r = run_train("oom", steps=2, batch=4, effective_batch=4, inject_oom_at_batch=3)
    ooms = r.events[r.events["kind"] == "oom"]
    assert len(ooms) == 2 == r.meta["train_summary"]["ooms"]  # micro-batch 4, then 3, then 2 fits
    for d in ooms["data"]:
        assert d["source"] == "exception" and "leaked_bytes" in d and d["micro_batch"] in (4, 3)
    assert len(oom_reports(r)) == 2


def test_budget_oom_event_carries_the_exact_numbers(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("budget", steps=1, batch=8, effective_batch=8, seq_len=64, min_len=64,
                  memory_budget_gb=5e6 / 2**30)
    d = r.events[r.events["kind"] == "oom"].iloc[0]["data"]
    assert d["measured_bytes"] > d["budget_bytes"] == d["capacity_bytes"] == int(5e6)
