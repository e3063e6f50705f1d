"""OOM forensics on runs that really ran out of memory (the trainer under a CPU
memory budget) and, for the GPU-only verdicts, on OOM events carrying the
numbers the GPU collector records: there is no GPU in CI, so the
fragmentation and another-process cases record those events from a real loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.oom_messages import LEGACY

from gpudash.analysis import summarize
from gpudash.analysis.oom import oom_reports, oom_verdicts
from gpudash.store.oom_message import parse_oom_message

GiB = 2**30


def _kinds(run: Any) -> dict[str, Any]:
    return {v.kind: v for v in summarize(run)}


def test_died_of_oom_under_a_budget_did_not_fit(recorded: Any) -> None:
    run = recorded("oom-crash")
    assert run.status == "crashed"
    reports = oom_reports(run)
    assert reports and not reports[-1].recovered
    last = reports[-1]
    assert last.verdict == "did not fit"
    assert last.capacity_bytes == run.meta["preflight"]["capacity_bytes"]
    assert last.categories["optimizer_bytes"] > 0 and last.categories_step is not None
    assert last.categories_step < last.step  # memory at the last completed step before the OOM
    v = _kinds(run)["oom:did not fit"]
    assert v.severity == "bad" and v.title.startswith("Died of OOM")
    assert any("memory at step" in e for e in v.evidence)
    assert v.recommendation and ("--offload optimizer" in v.recommendation or "--ckpt block" in v.recommendation)
    assert v.saving and "predicted peak" in v.saving


def test_recovered_ooms_are_warnings_with_a_step_range(recorded: Any) -> None:
    run = recorded("oom-recovered")
    assert run.status == "finished"
    vs = [v for v in oom_verdicts(run)]
    assert len(vs) == 1 and vs[0].severity == "warn" and vs[0].kind == "oom:did not fit"
    n = int((run.events["kind"] == "oom").sum())
    assert n >= 2 and vs[0].numbers["count"] == n
    assert vs[0].steps is not None and vs[0].steps[0] < vs[0].steps[1]


def _loop_then_oom_event(tmp_path: Path, name: str, **data: Any) -> Any:
    import torch

    import gpudash
    from gpudash.monitor import Monitor

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(tmp_path / name, host_hz=0) as mon:
        mon.watch(model, opt)
        for _ in range(5):
            with mon.step(samples=8):
                with mon.phase("forward"):
                    loss = model(torch.randn(8, 16)).square().mean()
                with mon.phase("backward"):
                    loss.backward()
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
        mon.event("oom", "CUDA out of memory (numbers as the GPU collector records them)", **data)
    return gpudash.load_run(tmp_path / name)


def test_fragmentation_enough_free_in_total_but_no_block_large_enough(tmp_path: Path) -> None:
    run = _loop_then_oom_event(tmp_path, "frag", source="allocator_observer", requested_bytes=2 * GiB,
                               free_bytes=int(0.4 * GiB), capacity_bytes=80 * GiB, allocated_bytes=70 * GiB,
                               reserved_bytes=int(79.5 * GiB), reserved_unallocated_bytes=int(9.5 * GiB),
                               largest_free_bytes=int(1.5 * GiB))
    (r,) = oom_reports(run)
    assert r.verdict == "fragmentation"
    v = _kinds(run)["oom:fragmentation"]
    assert "expandable_segments:True" in (v.recommendation or "")
    assert any("largest free block" in e for e in v.evidence)


def test_another_process_holds_the_memory(tmp_path: Path) -> None:
    run = _loop_then_oom_event(tmp_path, "other", requested_bytes=1 * GiB, free_bytes=int(0.2 * GiB),
                               capacity_bytes=24 * GiB, allocated_bytes=10 * GiB, reserved_bytes=11 * GiB)
    (r,) = oom_reports(run)
    assert r.verdict == "another process"
    assert r.outside_bytes is not None and r.outside_bytes > 12 * GiB
    v = _kinds(run)["oom:another process"]
    assert "another process" in (v.recommendation or "")


def test_oom_event_without_numbers_from_the_cuda_message(tmp_path: Path) -> None:
    msg = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
           "1.10 GiB is free. Of the allocated memory 21.20 GiB is allocated by PyTorch, and 310.00 MiB is "
           "reserved by PyTorch but unallocated.")
    run = _loop_then_oom_event(tmp_path, "msg")
    run.events.loc[run.events["kind"] == "oom", "message"] = msg
    (r,) = oom_reports(run)
    assert r.requested_bytes == 4 * GiB and r.verdict == "did not fit"


def test_forensics_read_the_message_as_the_collector_does(tmp_path: Path) -> None:
    """One parser: a legacy message in an event with no numbers gives the report the collector's bytes."""
    run = _loop_then_oom_event(tmp_path, "legacy")
    run.events.loc[run.events["kind"] == "oom", "message"] = LEGACY
    (r,) = oom_reports(run)
    d = parse_oom_message(LEGACY)
    assert r.capacity_bytes == d.capacity_bytes == round(15.78 * GiB)  # binary, as torch prints it
    assert r.reserved_unallocated_bytes == d.reserved_unallocated_bytes > 0


def test_injected_oom_is_named_as_a_testing_aid(tmp_path: Path) -> None:
    import gpudash
    from gpudash.options import MonitorOptions
    from gpudash.trainer import TrainConfig, train

    train(TrainConfig(run_dir=tmp_path / "inj", device="cpu", steps=4, batch=4, effective_batch=4,
                      inject_oom_at_batch=4, monitor=MonitorOptions(host_hz=0)))
    run = gpudash.load_run(tmp_path / "inj")
    assert {r.verdict for r in oom_reports(run)} == {"injected"}


def test_recommendation_uses_the_trainers_estimator(recorded: Any) -> None:
    run = recorded("oom-recovered")  # the trainer records its model shape; the OOM event its micro-batch
    v = _kinds(run)["oom:did not fit"]
    assert v.numbers["micro_batch"] >= 2
    assert "--ckpt block" in (v.recommendation or "") and "(estimator" in (v.saving or "")
    assert 0 < v.numbers["saving_bytes"] < v.numbers["need_bytes"]


def test_oom_without_capacity_or_request_is_undetermined(tmp_path: Path) -> None:
    run = _loop_then_oom_event(tmp_path, "bare", batch_size=32)
    (r,) = oom_reports(run)
    assert r.verdict == "undetermined" and any("cannot be decided" in e for e in r.evidence)


def test_oom_evidence_the_chart_and_the_event_tell_one_story(recorded: Any) -> None:
    import re

    from gpudash.server.layouts.memory import capacity_lines
    from gpudash.units import human_bytes

    for name in ("oom-crash", "oom-recovered"):
        run = recorded(name)
        reports = oom_reports(run)
        assert len(reports) == int((run.events["kind"] == "oom").sum())  # one OOM, one event, one report
        for r in reports:
            # the category stack quoted is one moment: under that step's measured peak
            assert r.peak_bytes is not None and sum(r.categories.values()) <= r.peak_bytes
            assert r.need_bytes is not None and r.capacity_bytes is not None and r.need_bytes > r.capacity_bytes
        # a retried step is measured like any other (sampling is not spent on the failed attempt)
        retried = run.events.loc[run.events["kind"] == "oom", "step"].astype(int)
        mem = run.memory.set_index("step")
        assert mem.loc[[s for s in retried if s in mem.index], "activations_bytes"].notna().all()
        v = _kinds(run)["oom:did not fit"]
        need, cap = re.findall(r"needed (.+) of (.+) capacity", next(e for e in v.evidence if "needed" in e))[0]
        assert need != cap  # never "needed 3.5 MiB of 3.5 MiB"
        # the chart's limit line is the capacity the OOM was judged against, quoted alike
        assert f"budget {cap}" in [f"{label} {human_bytes(b, 2)}" for label, b, _ in capacity_lines(run.meta)]
