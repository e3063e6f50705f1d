"""Byte counts quoted side by side never read as equal when they are not."""

from __future__ import annotations

from gpudash.units import distinct_bytes, human_bytes


def test_close_values_get_the_digits_that_tell_them_apart() -> None:
    assert distinct_bytes(3_660_000, 3_662_640) == ["3.490 MiB", "3.493 MiB"]
    assert distinct_bytes(3_660_000, 3_696_396) == ["3.49 MiB", "3.53 MiB"]  # not "3.5 MiB of 3.5 MiB"
    assert distinct_bytes(8_000_000, 8_300_000, min_digits=2) == ["7.63 MiB", "7.92 MiB"]
    assert distinct_bytes(3_660_000, 3_660_000) == ["3.5 MiB", "3.5 MiB"]  # equal values print alike
    assert distinct_bytes(None, 2048) == ["-", "2.0 KiB"]
    a, b = distinct_bytes(2**30, 2**30 + 1)
    assert a != b and a.endswith(" B")  # beyond the decimals: exact bytes


def test_human_bytes_digits() -> None:
    assert human_bytes(8_000_000) == "7.6 MiB" and human_bytes(8_000_000, 2) == "7.63 MiB"
