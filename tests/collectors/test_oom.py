"""The oom event: one per OOM, the message's numbers and the allocator observer's together."""

from __future__ import annotations

from pathlib import Path

from helpers.oom_messages import CURRENT, LEGACY

import gpudash
from gpudash.collectors.oom import flush_observed_oom, note_observed_oom, record_oom
from gpudash.monitor import Monitor

GiB, MiB = 1 << 30, 1 << 20


def test_record_oom_event_and_no_double_count(tmp_path: Path) -> None:
    with Monitor(tmp_path / "r", host_hz=0) as m:
        data = record_oom(m, RuntimeError(CURRENT), batch_size=32)
        # the allocator's observer saw the next one first: one event carries both sides' numbers
        note_observed_oom(m, {"source": "allocator_observer", "requested_bytes": 20 * MiB, "free_bytes": 11 * MiB,
                              "capacity_bytes": 16 * GiB, "device": 0})
        record_oom(m, RuntimeError(LEGACY), leaked_bytes=0)
        record_oom(m, LEGACY)  # a later OOM, not seen by the observer
    assert data["requested_bytes"] == 20 * MiB
    ev = gpudash.load_run(tmp_path / "r").events
    ooms = ev[ev["kind"] == "oom"]
    assert len(ooms) == 3
    first = ooms.iloc[0]
    assert first["data"]["free_bytes"] == round(10.75 * MiB)
    assert first["data"]["batch_size"] == 32 and first["data"]["source"] == "exception"
    assert "tried to allocate 20.00 MiB" in first["message"]
    merged = ooms.iloc[1]["data"]
    assert merged["source"] == "allocator_observer+exception"
    assert merged["free_bytes"] == 11 * MiB  # the allocator's exact number, not the message's rounded one
    assert merged["leaked_bytes"] == 0 and merged["format"] == "legacy"
    assert ooms.iloc[2]["data"]["source"] == "exception"


def test_an_observed_oom_nobody_claims_is_recorded_at_close(tmp_path: Path) -> None:
    m = Monitor(tmp_path / "r", host_hz=0)
    note_observed_oom(m, {"source": "allocator_observer", "requested_bytes": 2 * GiB})
    flush_observed_oom(m)
    flush_observed_oom(m)  # once only
    m.close("crashed", "exception: OutOfMemoryError")
    ooms = gpudash.load_run(tmp_path / "r").events.query("kind == 'oom'")
    assert len(ooms) == 1 and ooms.iloc[0]["data"]["requested_bytes"] == 2 * GiB
