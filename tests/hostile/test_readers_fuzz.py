"""The readers over arbitrary bytes and values (issue 26, hypothesis): ``run.json`` of any bytes, a meta
table of any keys and values, columns of any names and cells of any type: never an exception, every
problem one line, every step kept, and /metrics still one family per name."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.hostile_cases import healthy
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from gpudash.server.metrics import metrics_registry
from gpudash.store import load_run
from gpudash.store.reader import RunReader
from gpudash.store.schema import quote_ident

_TEMPLATE: list[Path] = []
SETTINGS = settings(max_examples=25, deadline=None)
cells = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
                  st.text(max_size=200), st.binary(max_size=200))
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)


@contextmanager
def _run() -> Iterator[Path]:
    """A fresh copy of one healthy run (made once: the Recorder is the slow part)."""
    if not _TEMPLATE:
        _TEMPLATE.append(healthy(Path(tempfile.mkdtemp(prefix="gpudash-fuzz-")) / "template"))
    folder = Path(tempfile.mkdtemp(prefix="gpudash-fuzz-"))
    try:
        run = folder / "runs" / "r"
        shutil.copytree(_TEMPLATE[0], run)
        yield run
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _one_line(problems: list[str]) -> None:
    for p in problems:
        assert isinstance(p, str) and "\n" not in p and len(p) < 1000, p


@SETTINGS
@given(st.binary(max_size=3000) | st.text(max_size=3000).map(str.encode))
def test_run_json_of_any_bytes(data: bytes) -> None:
    with _run() as run:
        (run / "run.json").write_bytes(data)
        r = load_run(run)
        try:
            assert len(r.steps) == 30 and isinstance(r.name, str) and len(r.name) <= 1001
            _one_line(r.problems)
        finally:
            r.close()


@SETTINGS
@given(st.lists(st.tuples(st.one_of(names, cells), cells), max_size=20))
def test_meta_of_any_keys_and_values(rows: list[tuple[Any, Any]]) -> None:
    with _run() as run:
        with sqlite3.connect(run / "rank0.db") as c:
            c.execute("DROP TABLE meta")
            c.execute("CREATE TABLE meta (key, value)")  # no types, no key constraint: anything goes
            c.executemany("INSERT INTO meta VALUES (?, ?)", rows)
        reader = RunReader(run)
        try:
            meta = reader.ranks[0].meta()
            assert all(isinstance(k, str) for k in meta)
            reader.status()  # decided from whatever the table holds, without raising
            _one_line(reader.all_problems())
        finally:
            reader.close()


@SETTINGS
@given(st.lists(st.tuples(names, cells), min_size=1, max_size=8, unique_by=lambda t: t[0].lower()))
def test_columns_of_any_name_and_cells_of_any_type(cols: list[tuple[str, Any]]) -> None:
    with _run() as run:
        with sqlite3.connect(run / "rank0.db") as c:
            have = {r[1].lower() for r in c.execute("PRAGMA table_info(steps)")}
            for name, value in cols:
                if name.lower() in have or name.lower() in ("rowid", "oid", "_rowid_"):
                    continue
                c.execute(f"ALTER TABLE steps ADD COLUMN {quote_ident(name)}")
                c.execute(f"UPDATE steps SET {quote_ident(name)} = ? WHERE step % 3 = 0", (value,))
        r = load_run(run)
        try:
            assert len(r.steps) == 30 and list(r.steps["step"]) == list(range(30))
            _one_line(r.problems)
        finally:
            r.close()
        text = generate_latest(metrics_registry(run.parent, facts=False)).decode()
        helps = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP "))
        assert helps and max(helps.values()) == 1
        samples = Counter(line.rsplit(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#")
        assert max(samples.values()) == 1
