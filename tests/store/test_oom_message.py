"""The one OOM-message parser, on real messages of every format: keys, and torch's binary units."""

from __future__ import annotations

import pytest
import torch
from helpers.oom_messages import CURRENT, LEGACY, MPS, TORCH21

from gpudash.store.oom_message import parse_oom_message, parse_size

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def gib(x: float) -> int:
    return round(x * GiB)


def test_current_format() -> None:
    d = parse_oom_message(CURRENT)
    assert d.format == "current"
    assert d.requested_bytes == 20 * MiB
    assert d.device == 0
    assert d.capacity_bytes == gib(79.15)
    assert d.free_bytes == round(10.75 * MiB)
    assert d.allocated_bytes == gib(76.20)
    assert d.reserved_unallocated_bytes == round(401.45 * MiB)
    assert d.reserved_bytes == gib(76.20) + round(401.45 * MiB)
    assert d.process_bytes == gib(77.13)
    assert d.processes == {1234: 2 * GiB}


def test_torch21_spelling_allowed_cap_and_private_pools() -> None:
    d = parse_oom_message(TORCH21)
    assert d.device == 1 and d.capacity_bytes == gib(23.65)
    assert d.allowed_bytes == 8 * GiB
    assert d.private_pools_bytes == 512 * MiB
    assert d.reserved_unallocated_bytes == 100 * KiB


def test_legacy_format() -> None:
    d = parse_oom_message(LEGACY)
    assert d.format == "legacy"
    assert d.requested_bytes == 20 * MiB and d.device == 0
    assert d.capacity_bytes == gib(15.78)
    assert d.allocated_bytes == gib(14.20)
    assert d.free_bytes == round(10.75 * MiB)
    assert d.reserved_bytes == gib(14.50)
    assert d.reserved_unallocated_bytes == gib(14.50) - gib(14.20)


def test_a_torch_gb_is_two_to_the_thirty() -> None:
    """The MPS allocator writes GB and MB for the same powers of 1024 CUDA's calls GiB and MiB (one
    parser used to read them as 10**9)."""
    d = parse_oom_message(MPS)
    assert d.format == "mps"
    assert d.requested_bytes == 256 * MiB and d.allowed_bytes == gib(18.13)
    assert d.allocated_bytes == gib(17.50) and d.other_bytes == 512 * MiB
    assert parse_size("1.00 GB") == parse_size("1.00 GiB") == GiB


def test_the_message_without_its_first_words() -> None:
    """An event's message may keep only part of the text: the numbers are still read."""
    d = parse_oom_message("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.44 MiB "
                          "is free. Of the allocated memory 7.50 GiB is allocated by PyTorch, and 100.00 MiB is "
                          "reserved by PyTorch but unallocated.")
    assert d.requested_bytes == 20 * MiB and d.reserved_unallocated_bytes == 100 * MiB
    assert d.capacity_bytes == gib(7.79)


def test_the_trainers_budget_message_exact_bytes() -> None:
    from gpudash.trainer.batching import BudgetMeter

    meter = BudgetMeter(1000, lambda: 0)
    x = torch.ones(100, requires_grad=True)
    meter.begin()
    try:
        with pytest.raises(torch.OutOfMemoryError) as ei:
            _ = (x * x).sum()  # saves both 400-byte inputs... then more than the 1000-byte budget
            _ = (x.exp() * x.sin()).sum()
    finally:
        meter.end()
    d = parse_oom_message(str(ei.value))
    assert d.format == "budget" and d.budget_bytes == 1000 and d.measured_bytes == meter.refused


def test_not_an_oom() -> None:
    assert not parse_oom_message("RuntimeError: shapes do not match")
    assert parse_oom_message(None).to_dict() == {}  # type: ignore[arg-type]
    assert parse_oom_message("injected OOM: micro-batch 4 >= 4 (gpudash --inject-oom-at-batch)").to_dict() == {}
    assert parse_oom_message("CUDA out of memory.").to_dict() == {"format": "current"}
    d = parse_oom_message(CURRENT).to_dict()  # an oom event's data: the printed numbers only
    assert d["requested_bytes"] == 20 * MiB and "other_bytes" not in d
    assert parse_size("512 bytes") == 512 and parse_size("1.50 KiB") == 1536
    with pytest.raises(ValueError):
        parse_size("12 parsecs")
