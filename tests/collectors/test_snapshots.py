"""The snapshot collector end to end: schedule, request file, OOM; stored and read back.

``take_snapshot`` stands in for ``torch.cuda.memory._snapshot`` (no GPU here)
and returns the documented-format fixture (synthetic until a GPU snapshot
replaces it); everything after it is the real pipeline.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import gpudash
from gpudash.collectors.oom import record_oom
from gpudash.collectors.snapshots import SnapshotCollector
from gpudash.monitor import Monitor
from gpudash.store.schema import SNAPSHOT_REQUEST_FILE

FIXTURE = Path(__file__).parent.parent / "fixtures" / "snapshot_synthetic.pickle"


def take() -> dict[str, Any]:
    with open(FIXTURE, "rb") as f:
        return pickle.load(f)  # our own fixture: trusted


def loop(m: Monitor, steps: int, between: Any = None) -> None:
    for i in range(steps):
        with m.step():
            pass
        if between is not None:
            between(i)


def test_every_n_steps(tmp_path: Path) -> None:
    col = SnapshotCollector(every=4, take_snapshot=take)
    with Monitor(tmp_path / "r", host_hz=0) as m:
        m.add_collector(col)
        loop(m, 10)
    maps = gpudash.load_run(tmp_path / "r").snapshots
    assert [(mm.step, mm.reason) for mm in maps] == [(4, "every 4 steps"), (8, "every 4 steps")]
    assert maps[0].reserved_bytes == gpudash.load_snapshot(FIXTURE).reserved_bytes
    assert col.taken == 2


def test_request_file_is_served_once_and_removed(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    col = SnapshotCollector(take_snapshot=take, poll_interval=0.05)
    with Monitor(run_dir, host_hz=0) as m:
        m.add_collector(col)
        loop(m, 2)
        (run_dir / SNAPSHOT_REQUEST_FILE).write_text("")
        deadline = time.monotonic() + 20
        while (run_dir / SNAPSHOT_REQUEST_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        loop(m, 3)
    assert not (run_dir / SNAPSHOT_REQUEST_FILE).exists()
    maps = gpudash.load_run(run_dir).snapshots
    assert [(mm.step, mm.reason) for mm in maps] == [(2, "requested")]


def test_a_request_is_stored_with_its_reason(tmp_path: Path) -> None:
    """gpudash's own requests (the leak watch's) are stored with their reason; the dashboard's file stays
    "requested" (a snapshot nobody asked for was shown as a user's request); two at one step share it."""
    from gpudash.monitor.leakwatch import SNAPSHOT_REASON

    run_dir = tmp_path / "r"
    col = SnapshotCollector(take_snapshot=take, poll_interval=0.05)
    with Monitor(run_dir, host_hz=0) as m:
        m.add_collector(col)
        loop(m, 1)
        col.request(SNAPSHOT_REASON)  # what the leak watch asks (its "before")
        loop(m, 2)
        (run_dir / SNAPSHOT_REQUEST_FILE).write_text("")  # the dashboard's button
        deadline = time.monotonic() + 20
        while (run_dir / SNAPSHOT_REQUEST_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        loop(m, 1)
        col.request(SNAPSHOT_REASON)
        col.request(SNAPSHOT_REASON)
        col.request()
        loop(m, 2)
    maps = gpudash.load_run(run_dir).snapshots
    assert SNAPSHOT_REASON == "leak watch"
    assert [(mm.step, mm.reason) for mm in maps] == [(1, "leak watch"), (3, "requested"),
                                                     (4, "leak watch, requested")]


def test_stale_request_from_an_earlier_run_is_ignored(tmp_path: Path) -> None:
    import os

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    req = run_dir / SNAPSHOT_REQUEST_FILE
    req.write_text("")
    old = time.time() - 3600
    os.utime(req, (old, old))
    with Monitor(run_dir, host_hz=0) as m:
        m.add_collector(SnapshotCollector(take_snapshot=take, poll_interval=0.05))
        loop(m, 3, between=lambda i: time.sleep(0.1))
    assert gpudash.load_run(run_dir).snapshots == []


def test_oom_observer_records_event_and_snapshot_at_once(tmp_path: Path) -> None:
    col = SnapshotCollector(take_snapshot=take, oom_snapshot_gap_s=3600)
    m = Monitor(tmp_path / "r", host_hz=0)
    m.add_collector(col)
    loop(m, 3)
    # what the allocator passes: device, bytes asked, device (or capped) total, device free
    col.on_oom(0, 30 << 20, 80 << 30, 12 << 20)
    col.on_oom(0, 30 << 20, 80 << 30, 12 << 20)  # a retry soon after: event yes, snapshot no
    record_oom(m, "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of 80.00 GiB "
                  "of which 12.00 MiB is free.")  # the trainer's except-block: already recorded
    m.close("crashed", "exception: OutOfMemoryError")
    run = gpudash.load_run(tmp_path / "r")
    ooms = run.events[run.events["kind"] == "oom"]
    assert len(ooms) == 2
    d = ooms.iloc[0]["data"]
    assert (d["requested_bytes"], d["free_bytes"], d["capacity_bytes"], d["device"]) == (30 << 20, 12 << 20,
                                                                                         80 << 30, 0)
    assert d["source"] == "allocator_observer"
    assert d["largest_free_bytes"] == gpudash.load_snapshot(FIXTURE).largest_free_bytes
    assert "largest_free_bytes" not in ooms.iloc[1]["data"]  # no second snapshot within the gap
    assert [(mm.reason, mm.step) for mm in run.snapshots] == [("oom", 3)]
    assert run.status == "crashed"


def test_a_failing_snapshot_never_reaches_the_loop(tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        return {"segments": "not a list"}

    with Monitor(tmp_path / "r", host_hz=0) as m:
        m.add_collector(SnapshotCollector(every=1, take_snapshot=broken))
        loop(m, 3)
    run = gpudash.load_run(tmp_path / "r")
    assert len(run.steps) == 3 and run.snapshots == []
    assert (run.events["kind"] == "snapshot_failed").sum() >= 1


# A real torch >= 2.3 OOM message (quoted in pytorch/pytorch#16417) and the observer call that precedes it
REAL_OOM = ("CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which "
            "11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the "
            "allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
REAL_SNAPSHOT = Path(__file__).parent.parent / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"


def take_real() -> dict[str, Any]:
    with open(REAL_SNAPSHOT, "rb") as f:
        snap = pickle.load(f)  # a copy of a real snapshot kept in this repository: trusted
    return {"segments": snap["segments"], "allocator_settings": snap.get("allocator_settings")}


def test_one_oom_is_one_event_when_observer_and_trainer_both_see_it(tmp_path: Path) -> None:
    """The allocator calls the observer (what torch._C._cuda_attach_out_of_memory_observer was given:
    device, bytes asked, device limit, device free), then raises; the loop's except-block calls
    record_oom. One event, with the observer's exact numbers, the snapshot's largest free block
    and the caller's leaked bytes."""
    import gpudash.collectors.snapshots as snapshots

    col = SnapshotCollector(take_snapshot=take_real, oom_snapshot_gap_s=3600)
    m = Monitor(tmp_path / "r", host_hz=0)
    m.add_collector(col)
    loop(m, 2)
    snapshots._dispatch_oom(0, 22 << 20, round(23.65 * (1 << 30)), round(11.06 * (1 << 20)))
    record_oom(m, REAL_OOM, micro_batch=8, bytes_before=100, bytes_after=100, leaked_bytes=0)
    loop(m, 1)  # the next step finds nothing left to record
    snapshots._dispatch_oom(0, 22 << 20, round(23.65 * (1 << 30)), round(11.06 * (1 << 20)))
    m.close("crashed", "exception: OutOfMemoryError")  # an OOM nobody caught: recorded at close
    run = gpudash.load_run(tmp_path / "r")
    ooms = run.events[run.events["kind"] == "oom"]
    assert len(ooms) == 2
    d = ooms.iloc[0]["data"]
    assert d["source"] == "allocator_observer+exception" and ooms.iloc[0]["step"] == 2
    assert d["requested_bytes"] == 22 << 20 and d["free_bytes"] == round(11.06 * (1 << 20))
    assert d["leaked_bytes"] == 0 and d["micro_batch"] == 8
    assert d["largest_free_bytes"] == 329_252_864  # the real snapshot's largest inactive block
    assert d["allocated_bytes"] == round(22.90 * (1 << 30))  # from the message: the observer has no stats here
    assert ooms.iloc[1]["data"]["source"] == "allocator_observer" and ooms.iloc[1]["step"] == 3
    assert [mm.reason for mm in run.snapshots] == ["oom"]
    assert run.snapshots[0].largest_free_bytes == 329_252_864


def test_a_long_history_is_kept_whole_at_record_time(tmp_path: Path) -> None:
    """A 120,000-entry history (over the old 100,000 cap and the 5,000,000-node budget's share): every entry
    stored, as torch recorded it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from snapshot_gen import grow_snapshot

    big = grow_snapshot(120_000)
    col = SnapshotCollector(every=2, take_snapshot=lambda: big)
    with Monitor(tmp_path / "r", host_hz=0) as m:
        m.add_collector(col)
        loop(m, 3)
    [mm] = gpudash.load_run(tmp_path / "r").snapshots
    assert mm.trace is not None and len(mm.trace) == 120_000 and mm.truncated_trace == 0
    raw = big["device_traces"][0]
    assert mm.trace["address"].tolist()[-5:] == [e["addr"] for e in raw[-5:]]
    assert mm.trace["action"].astype(str).tolist()[:3] == [e["action"] for e in raw[:3]]
