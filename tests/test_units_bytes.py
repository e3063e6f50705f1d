"""Byte counts quoted side by side never read as equal when they are not."""

from __future__ import annotations

import ast
from pathlib import Path

from gpudash.units import distinct_bytes, fmt_num, human_bytes


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
    assert human_bytes(None) == "-" and human_bytes(float("nan"), missing="?") == "?"
    assert human_bytes(20 * 2**20, 2) == "20.00 MiB"  # as torch's OOM message prints it


def test_fmt_num() -> None:
    assert fmt_num(12345.6) == "12,346" and fmt_num(3.14159) == "3.14" and fmt_num(0.5, 2) == "0.5"
    assert fmt_num(None) == "-" and fmt_num(float("nan")) == "-"


def test_bytes_and_numbers_are_formatted_in_one_place() -> None:
    """Issue 35: six byte formatters (MiB or GiB, 2**30 or 10**9, "?" or "-") told one number
    six ways; every surface now calls gpudash.units."""
    pkg = Path(__file__).resolve().parents[1] / "gpudash"
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "units.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.lstrip("_") in (
                    "fmt_bytes", "fmt_gb", "gib", "fmt_num", "human_bytes", "fmt_gib"):
                bad.append(f"{path.relative_to(pkg.parent)}:{node.lineno} {node.name}")
    assert bad == [], "format with gpudash.units: " + ", ".join(bad)
