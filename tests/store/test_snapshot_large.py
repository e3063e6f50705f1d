"""Big honest snapshots kept whole, hostile ones stopped while they are read (issues 26 and 27).

A real torch snapshot grown to tens of thousands of entries (benchmarks/snapshot_gen.py, the real fixture's
frames) is read with the default options and every entry stored; a small pickle that would make gigabytes
of empty lists is refused after a few megabytes (memory counted while unpickling); stored summaries that
inflate past what they say they hold are refused with the reason, and a MemoryError is a one-line note."""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpudash.cli import main as cli
from gpudash.errors import RunError
from gpudash.store import load_run, snapshot, snapshot_codec
from gpudash.store.snapshot import (
    SUMMARY_FORMAT,
    SUMMARY_FORMAT_V1,
    decode_summary,
    encode_summary,
    load_snapshot,
    read_snapshot_pickle,
    snapshots_from_frame,
    summarize,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from snapshot_gen import grow_snapshot


@pytest.fixture(scope="module")
def grown() -> dict[str, Any]:
    return grow_snapshot(30_000)


def test_a_grown_real_snapshot_is_kept_whole(grown: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(grown, protocol=4))
    assert cli(["import-snapshot", str(path), str(tmp_path / "run")]) == 0
    [mm] = load_run(tmp_path / "run").snapshots
    raw = grown["device_traces"][0]
    assert len(mm.trace) == len(raw) == 30_000 and mm.truncated_trace == 0
    assert mm.trace["address"].tolist() == [e["addr"] for e in raw]
    assert mm.trace["size"].tolist() == [e["size"] for e in raw]
    assert mm.trace["action"].astype(str).tolist() == [e["action"] for e in raw]
    assert mm.trace["time_us"].tolist() == [float(e["time_us"]) for e in raw]
    direct = load_snapshot(path)  # the same facts read straight from the file
    assert direct.trace["stack"].astype(str).tolist() == mm.trace["stack"].astype(str).tolist()
    assert any("model.py:" in s for s in mm.trace["stack"].astype(str).unique())


def test_columns_round_trip_bit_for_bit(grown: dict[str, Any]) -> None:
    s = summarize(grown)
    back = decode_summary(encode_summary(s))
    for table in ("blocks", "trace"):
        assert set(back[table]) == set(s[table])
        for k, v in s[table].items():
            assert np.array_equal(back[table][k], v), (table, k)
    assert back["frames"] == s["frames"] and back["stacks"] == s["stacks"]


def test_a_pickle_of_empty_lists_is_stopped_while_it_is_read(tmp_path: Path) -> None:
    """One byte of pickle (EMPTY_LIST) makes a 64-byte list: 8 million of them (8 MB, written opcode by opcode,
    never built here) would make ~600 MB. Counted while unpickling, it stops after a few MB read (the slack
    lowered so the test stays small)."""
    data = b"\x80\x04]" + b"(" + b"]" * 8_000_000 + b"e."
    with pytest.raises(RunError) as err:
        read_snapshot_pickle(data, where="bomb.pickle", slack=16 * 2**20)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("bomb.pickle: refused: the pickle makes far more objects")
    made_from = float(msg.split("made from its first ")[1].split(" MiB")[0])
    assert made_from < len(data) / 2**20 / 2  # stopped well before the end of the file


def test_the_meter_is_not_fooled_by_garbage_the_collector_frees_meanwhile() -> None:
    """A process holding cyclic garbage in the collector's oldest generation (a test worker after many tests): a
    full collection on the way freed it while the pickle's lists were made, the meter saw little growth, and an
    8 MB pickle of empty lists was read whole (CI). The collector is paused while reading: stopped at the first
    look after the first MiB."""
    import gc

    junk: list[Any] | None = []
    for _ in range(800_000):
        a: list[Any] = []
        a.append([a])
        junk.append(a)  # type: ignore[union-attr]
    gc.collect()  # into the oldest generation
    junk = None  # garbage there now: only a full collection frees it
    data = b"\x80\x04]" + b"(" + b"]" * 8_000_000 + b"e."
    try:
        with pytest.raises(RunError) as err:
            read_snapshot_pickle(data, where="bomb.pickle", slack=16 * 2**20)
    finally:
        gc.collect()
    msg = str(err.value)
    assert float(msg.split("made from its first ")[1].split(" MiB")[0]) <= 1.0, msg


def test_the_pickle_is_stopped_where_the_resident_size_does_not_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that freed more than the pickle makes reuses those pages: its resident size stays flat while
    the objects are made (a CI worker after a big test read the whole pickle above). Python's small blocks
    still count them."""
    import gpudash.store.snapshot_pickle as sp

    monkeypatch.setattr(sp, "_rss_reader", lambda: (lambda: 1 << 30))  # resident size: never grows
    data = b"\x80\x04]" + b"(" + b"]" * 8_000_000 + b"e."
    with pytest.raises(RunError, match="refused: the pickle makes far more objects"):
        read_snapshot_pickle(data, where="bomb.pickle", slack=16 * 2**20)


def test_the_same_pickle_under_a_generous_bound_is_only_not_a_snapshot() -> None:
    data = pickle.dumps([[] for _ in range(100_000)], protocol=4)
    with pytest.raises(RunError, match="top level is list"):
        read_snapshot_pickle(data)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)
    out: list[BaseException] = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(RunError, load_snapshot, fifo).value), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and "not a regular file" in str(out[0])


def _row(data: bytes, fmt: str = SUMMARY_FORMAT) -> pd.DataFrame:
    return pd.DataFrame([{"rank": 0, "time": 1.0, "step": 3, "reason": "crafted", "format": fmt, "data": data}])


def _problem(data: bytes, fmt: str = SUMMARY_FORMAT) -> str:
    problems: list[str] = []
    assert snapshots_from_frame(_row(data, fmt), problems) == []
    assert len(problems) == 1 and "\n" not in problems[0]
    assert "unreadable ()" not in problems[0] and "unreadable: )" not in problems[0]
    return problems[0]


def test_a_column_that_inflates_past_its_rows_is_refused(grown: dict[str, Any]) -> None:
    s = summarize({"segments": [], "device_traces": [grown["device_traces"][0][:10]]})
    blob = bytearray(encode_summary(s))
    (head_len,) = struct.unpack_from("<I", blob, 5)
    header = json.loads(zlib.decompress(bytes(blob[9:9 + head_len])))
    body = bytes(blob[9 + head_len:])
    # the first trace column replaced by 400 MB of zeros (400 kB compressed)
    first = next(i for i, c in enumerate(header["columns"]) if c[0] == "trace")
    offset = sum(c[3] for c in header["columns"][:first])
    bomb = zlib.compress(b"\0" * (400 * 2**20), 9)
    header["columns"][first][3] = len(bomb)
    head = zlib.compress(json.dumps(header).encode())
    old = header["columns"][first]
    crafted = b"GDMM2" + struct.pack("<I", len(head)) + head + body[:offset] + bomb
    assert len(crafted) < 1_000_000 and old
    msg = _problem(crafted)
    assert "inflates to over" in msg and "more than it says it holds" in msg


def test_a_header_claiming_too_many_rows_is_refused() -> None:
    head = zlib.compress(json.dumps({"format": SUMMARY_FORMAT, "segments": {}, "trace_rows": 10**12,
                                     "columns": []}).encode())
    msg = _problem(b"GDMM2" + struct.pack("<I", len(head)) + head)
    assert "10^12" in msg or "1000000000000" in msg


def test_a_v1_summary_of_millions_of_lists_is_refused_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case, scaled down: valid summary JSON (here 2.4 MB of ``[],``; 400 MB in the issue) that
    would make a list per two bytes. Counted before json.loads, refused with the reason."""
    monkeypatch.setattr(snapshot_codec, "MAX_CONTAINERS", 100_000)
    lists = ",".join(["[]"] * 800_000)
    text = f'{{"format": "{SUMMARY_FORMAT_V1}", "segments": {{}}, "blocks": {{}}, "x": [{lists}]}}'
    msg = _problem(zlib.compress(text.encode(), 9), SUMMARY_FORMAT_V1)
    assert "lists and objects" in msg and "counted before parsing" in msg


def test_memory_error_is_a_one_line_note(monkeypatch: pytest.MonkeyPatch, grown: dict[str, Any]) -> None:
    def boom(data: bytes, max_bytes: int | None = None) -> dict[str, Any]:
        raise MemoryError

    good = encode_summary(summarize({"segments": [], "device_traces": [grown["device_traces"][0][:10]]}))
    monkeypatch.setattr(snapshot, "decode_summary", boom)
    assert "too large for the memory this process has" in _problem(good)


def test_deep_stacks_each_entry_gets_the_stack_of_its_own_frames() -> None:
    """Deep stacks (53 frames an entry, shared native frame dicts first, as ``stacks="all"`` records them) are
    looked up by a short key checked against the list seen before: lists that share their length and their
    first, middle and last frame but differ elsewhere, or hold equal copies of the frames, still get the stack
    their own frames say."""
    from gpudash.store.snapshot_read import top_frames

    snap = grow_snapshot(6_000, frames=53)
    raw = snap["device_traces"][0]
    assert {len(e["frames"]) for e in raw} == {53}
    user = {"filename": "/work/train.py", "line": 7, "name": "step"}
    other = {"filename": "/work/model.py", "line": 9, "name": "attn"}
    base = raw[0]["frames"]
    twins = []
    for i, fr in enumerate((user, other, dict(user))):  # same ends and middle, a different frame inside
        e = dict(raw[0])
        e["frames"] = [*base[:10], fr, *base[11:]]
        twins.append(e)
        raw.insert(100 + i, e)
    copy = dict(raw[5])
    copy["frames"] = [dict(f) for f in raw[5]["frames"]]  # equal frames in dicts of their own
    raw.append(copy)
    s = summarize(snap, max_nodes=10**8)
    stacks, frames = s["stacks"], s["frames"]
    got = [[frames[i] for i in stacks[sid]] for sid in s["trace"]["stack"].tolist()]
    assert got == [top_frames(e["frames"]) for e in raw]
    assert got[100][0] == "/work/train.py:7 step" and got[101][0] == "/work/model.py:9 attn" and got[102] == got[100]
