"""Byte counts quoted side by side never read as equal when they are not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpudash.units import GiB, MiB, byte_unit, distinct_bytes, fmt_num, human_bytes, parse_size


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


_UNIT = re.compile(r"(?:KiB|MiB|GiB|TiB|KB|kB|MB|GB|TB)(?![A-Za-z])")
_BINARY = {2**10, 2**20, 2**30, 2**40, 1024.0, 2.0**20, 2.0**30}


def _unit_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a number is formatted next to a unit label (f-string, str.format, % or +), or a bytes value is
    divided by a power of 1024 (a conversion to a unit)."""
    hits: list[tuple[int, str]] = []

    def text(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def constant(node: ast.AST) -> float | None:
        try:
            v = ast.literal_eval(node)
        except ValueError:
            return None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):  # a table of units: a ladder or a parser's
            items = [e for e in (node.keys if isinstance(node, ast.Dict) else node.elts) if e is not None]
            items += [x for e in items if isinstance(e, ast.Tuple) for x in e.elts]  # (label, size) pairs
            labels = [s for e in items if (s := text(e)) is not None and re.fullmatch(_UNIT.pattern, s.strip(), re.I)]
            if len(labels) >= 2:
                hits.append((node.lineno, ast.unparse(node)[:90]))
        elif isinstance(node, ast.JoinedStr):
            for a, b in zip(node.values, node.values[1:], strict=False):
                s = text(b)
                if isinstance(a, ast.FormattedValue) and s is not None and _UNIT.match(s.lstrip(" ")):
                    hits.append((node.lineno, ast.unparse(node)[:90]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            s = text(node.func.value)
            if s is not None and re.search(r"\}\s?" + _UNIT.pattern, s):
                hits.append((node.lineno, s[:90]))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and (s := text(node.left)) is not None:
            if re.search(r"%[-+ #0-9.]*[dfgesi]\s?" + _UNIT.pattern, s):
                hits.append((node.lineno, s[:90]))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (s := text(node.right)) is not None:
            if _UNIT.match(s.lstrip(" ")):
                hits.append((node.lineno, ast.unparse(node)[:90]))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.RShift)):
            if constant(node.right) in _BINARY or isinstance(node.op, ast.RShift) and constant(node.right) in (10, 20, 30):
                hits.append((node.lineno, ast.unparse(node)[:90]))
    return hits


def test_units_are_labelled_and_converted_in_units_py_only() -> None:
    """Issue 47: MiB/GiB f-strings in four modules and the axis ladder twice told the same bytes their own
    way; every label and conversion goes through gpudash.units. Nothing is allowed elsewhere."""
    pkg = Path(__file__).resolve().parents[1] / "gpudash"
    bad = [f"{path.relative_to(pkg.parent)}:{line} {src}"
           for path in sorted(pkg.rglob("*.py")) if path.name != "units.py"
           for line, src in _unit_literals(ast.parse(path.read_text(encoding="utf-8")))]
    assert bad == [], "label and convert units with gpudash.units:\n" + "\n".join(bad)


def test_the_unit_scan_finds_each_way_of_formatting_a_unit() -> None:
    """The scan above cannot pass by missing what it looks for."""
    for src in ('f"{n / 2**20:.1f} MiB"', 'f"{gb:g} GB card"', '"{} GiB".format(n)', '"%.1f MB" % n',
                'str(n) + " KiB"', "n / 1024.0", "n >> 20", 'f"{rate:g} GB/s"',
                '(("GB", 1e9), ("MB", 1e6))', '{"kib": 1024, "mib": 2**20}', '["B", "KiB", "MiB"]'):
        assert _unit_literals(ast.parse(src)), src
    for src in ('f"{human_bytes(n)} free"', '"--card-gb 8"', 'f"{n} bytes"', "n / 2", 'f"{n:g} GBps"',
                'given(8, "GB")'):
        assert not _unit_literals(ast.parse(src)), src


def test_one_byte_unit_ladder_for_every_axis() -> None:
    from gpudash.report.svgchart import axis_scale
    from gpudash.server.layouts.common import byte_unit as dashboard_unit

    for top in (0, 1000, 2048, 5 * MiB, 3 * GiB, 2**41, None):
        unit, size = byte_unit(top)
        assert dashboard_unit(top) == (unit, size)
        if top is not None:
            scale = axis_scale("bytes", float(top))
            assert (scale.unit, scale.div) == (unit, size)
    assert byte_unit(5 * MiB) == ("MiB", MiB) and byte_unit(None) == ("MiB", MiB) and byte_unit(10) == ("B", 1)


def test_sizes_as_torch_prints_them_read_back_through_units() -> None:
    from gpudash.store import oom_message

    assert parse_size("20.00 MiB") == 20 * MiB and parse_size("1.00 GB") == GiB and parse_size("512 bytes") == 512
    assert oom_message.parse_size is parse_size
    assert oom_message.parse_oom_message(
        "MPS backend out of memory (MPS allocated: 1.00 GB, other allocations: 2.00 MB, max allowed: 18.13 GB). "
        "Tried to allocate 256.00 MB on private pool.").allocated_bytes == GiB
