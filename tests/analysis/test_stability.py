"""Stability verdicts on runs that really misbehaved."""

from __future__ import annotations

from typing import Any

from gpudash.analysis.stability import loss_spikes, nonfinite_steps, ranges, stability_verdicts


def _by_kind(run: Any) -> dict[str, Any]:
    return {v.kind: v for v in stability_verdicts(run)}


def test_corrupted_batch_is_a_loss_spike(recorded: Any) -> None:
    run = recorded("loop-spike", loop={"steps": 60, "bad_batch_at": (40,)})
    assert loss_spikes(run) == [40]
    v = _by_kind(run)["loss-spike"]
    assert v.steps == (40, 40) and any("step 40" in e for e in v.evidence)


def test_clean_run_has_no_stability_verdicts(recorded: Any) -> None:
    assert _by_kind(recorded("healthy")) == {}


def test_fp16_overflow_collapses_the_loss_scale_and_falls_back(recorded: Any) -> None:
    run = recorded("loop-fp16", loop={"steps": 40, "fp16_overflow_at": tuple(range(20, 26)), "fallback_after": 5})
    kinds = _by_kind(run)
    assert kinds["loss-scale-collapse"].steps is not None and kinds["loss-scale-collapse"].steps[0] >= 20
    assert kinds["precision-fallback"].steps == (24, 24)
    assert set(nonfinite_steps(run)) == set(range(20, 25))


def test_trainer_nan_injection_and_fallback(recorded: Any) -> None:
    run = recorded("precision-fallback")  # fp16, --inject-nan-at-step 20..23, fallback after 3
    kinds = _by_kind(run)
    assert kinds["non-finite"].steps == (20, 23)
    assert kinds["precision-fallback"].severity == "warn" and "fp32" in kinds["precision-fallback"].evidence[0]


def test_adaptive_batch_that_keeps_hitting_the_budget_oscillates(recorded: Any) -> None:
    v = _by_kind(recorded("oom-recovered"))["batch-oscillation"]
    assert v.numbers["max_batch"] > v.numbers["settled_batch"] >= v.numbers["min_batch"]


def test_ranges() -> None:
    assert ranges([5, 1, 2, 3, 9]) == [(1, 3), (5, 5), (9, 9)]
