"""CUDA OOM messages of both formats, and the oom event."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpudash
from gpudash.collectors.oom import flush_observed_oom, note_observed_oom, parse_oom_message, parse_size, record_oom
from gpudash.monitor import Monitor

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10

# torch >= 2.1 (c10 CUDACachingAllocator), with one other process on the device
CURRENT = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which "
           "10.75 MiB is free. Process 1234 has 2.00 GiB memory in use. Including non-PyTorch memory, this process "
           "has 77.13 GiB memory in use. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 401.45 MiB "
           "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
           "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# torch 2.1 spelled "capacty"; with a memory-fraction cap and CUDA-graph pools
TORCH21 = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacty of 23.65 GiB of which "
           "1.50 GiB is free. 8.00 GiB allowed; Of the allocated memory 7.50 GiB is allocated by PyTorch, with "
           "512.00 MiB allocated in private pools (e.g., CUDA Graphs), and 100.00 KiB is reserved by PyTorch but "
           "unallocated.")
# torch < 2.1
LEGACY = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.20 GiB already "
          "allocated; 10.75 MiB free; 14.50 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
          "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
          "PYTORCH_CUDA_ALLOC_CONF")


def gib(x: float) -> int:
    return round(x * GiB)


def test_current_format() -> None:
    d = parse_oom_message(CURRENT)
    assert d["format"] == "current"
    assert d["requested_bytes"] == 20 * MiB
    assert d["device"] == 0
    assert d["capacity_bytes"] == gib(79.15)
    assert d["free_bytes"] == round(10.75 * MiB)
    assert d["allocated_bytes"] == gib(76.20)
    assert d["reserved_unallocated_bytes"] == round(401.45 * MiB)
    assert d["reserved_bytes"] == gib(76.20) + round(401.45 * MiB)
    assert d["process_bytes"] == gib(77.13)
    assert d["processes"] == {1234: 2 * GiB}


def test_torch21_spelling_allowed_cap_and_private_pools() -> None:
    d = parse_oom_message(TORCH21)
    assert d["device"] == 1 and d["capacity_bytes"] == gib(23.65)
    assert d["allowed_bytes"] == 8 * GiB
    assert d["private_pools_bytes"] == 512 * MiB
    assert d["reserved_unallocated_bytes"] == 100 * KiB


def test_legacy_format() -> None:
    d = parse_oom_message(LEGACY)
    assert d["format"] == "legacy"
    assert d["requested_bytes"] == 20 * MiB and d["device"] == 0
    assert d["capacity_bytes"] == gib(15.78)
    assert d["allocated_bytes"] == gib(14.20)
    assert d["free_bytes"] == round(10.75 * MiB)
    assert d["reserved_bytes"] == gib(14.50)
    assert d["reserved_unallocated_bytes"] == gib(14.50) - gib(14.20)


def test_not_an_oom() -> None:
    assert parse_oom_message("RuntimeError: shapes do not match") == {}
    assert parse_oom_message(None) == {}  # type: ignore[arg-type]
    assert parse_oom_message("CUDA out of memory.") == {"format": "current"}
    assert parse_size("512 bytes") == 512 and parse_size("1.50 KiB") == 1536
    with pytest.raises(ValueError):
        parse_size("12 parsecs")


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
