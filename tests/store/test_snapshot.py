"""Allocator snapshot files: reading, summarising, storing, and refusing hostile pickles.

The fixtures are synthetic (see tests/fixtures/make_snapshot_fixture.py) until
a snapshot written on a GPU replaces them; every assertion here is computed
from the fixture's own plain data, so a real snapshot passes too.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import random
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudash
from gpudash.cli import main as cli
from gpudash.errors import RunError
from gpudash.store.snapshot import (
    SUMMARY_FORMAT,
    decode_summary,
    encode_summary,
    load_snapshot,
    memory_map_from_summary,
    read_snapshot_pickle,
    snapshot_row,
    snapshots_from_frame,
    summarize,
    top_frame,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
#: the synthetic ones, and a real one taken on an NVIDIA H200 (torch 2.11, allocation history on: 3,000 entries) by
#: the device pack (benchmarks/collectors.py --fixtures)
SNAPSHOTS = [FIXTURES / "snapshot_synthetic.pickle", FIXTURES / "snapshot_synthetic_torch21.pickle",
             FIXTURES / "snapshot_h200.pickle"]


def plain(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)  # our own fixture: trusted


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_load_snapshot_matches_the_raw_dict(path: Path) -> None:
    raw = plain(path)
    mm = gpudash.load_snapshot(path)
    segs = raw["segments"]
    blocks = [b for s in segs for b in s["blocks"]]
    assert mm.reserved_bytes == sum(s["total_size"] for s in segs)
    assert mm.allocated_bytes == sum(s["allocated_size"] for s in segs)
    assert mm.free_bytes == sum(b["size"] for b in blocks if b["state"] == "inactive")
    assert mm.largest_free_bytes == max(b["size"] for b in blocks if b["state"] == "inactive")
    assert 0 < mm.fragmentation_pct < 100
    assert list(mm.segments.columns[:6]) == ["device", "address", "total_size", "allocated_size", "active_size",
                                             "requested_size"]
    assert {"stream", "segment_type", "blocks"} <= set(mm.segments.columns)
    assert mm.segments["blocks"].tolist() == [len(s["blocks"]) for s in segs]
    assert mm.blocks["size"].sum() == mm.reserved_bytes
    assert set(mm.blocks["state"]) == {b["state"] for b in blocks}
    trace = [e for dev in raw.get("device_traces", []) for e in dev]
    assert mm.trace is not None and len(mm.trace) == len(trace)
    assert mm.trace["action"].tolist() == [e["action"] for e in trace]
    oom = mm.trace[mm.trace["action"] == "oom"]
    assert oom["device_free"].tolist() == [e["device_free"] for e in trace if e["action"] == "oom"]
    assert mm.reason.startswith("file ")


def test_top_frame_skips_torch_internals() -> None:
    frames = [{"filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 1, "name": "forward"},
              {"filename": "/home/me/train.py", "line": 42, "name": "step"}]
    assert top_frame(frames) == "/home/me/train.py:42 step"
    assert top_frame(frames[:1]).startswith("/x/site-packages/torch")
    assert top_frame([]) == "" and top_frame(None) == "" and top_frame(["junk"]) == ""


def test_minimal_snapshot_all_optional_keys_missing() -> None:
    snap = {"segments": [{"blocks": [{"size": 512, "state": "active_allocated"}, {"size": 1536}]}]}
    mm = memory_map_from_summary(summarize(read_snapshot_pickle(pickle.dumps(snap))))
    assert mm.reserved_bytes == 2048 and mm.allocated_bytes == 512
    assert mm.trace is None
    assert mm.blocks["address"].tolist() == [0, 512]


def _lists(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary with its numpy columns as lists (comparable with ==)."""
    out = dict(summary)
    for table in ("blocks", "trace"):
        if out.get(table) is not None:
            out[table] = {k: np.asarray(v).tolist() for k, v in out[table].items()}
    return out


def test_summary_round_trip_and_row() -> None:
    raw = plain(SNAPSHOTS[0])
    summary = summarize(raw)
    assert _lists(decode_summary(encode_summary(summary))) == _lists(summary)
    row = snapshot_row(summary, time=12.5, step=7, reason="oom")
    assert row["format"] == SUMMARY_FORMAT and isinstance(row["data"], bytes)
    df = pd.DataFrame([{"rank": 0, **row}])
    problems: list[str] = []
    (mm,) = snapshots_from_frame(df, problems)
    assert problems == []
    assert (mm.step, mm.reason, mm.time, mm.rank) == (7, "oom", 12.5, 0)
    assert mm.reserved_bytes == load_snapshot(SNAPSHOTS[0]).reserved_bytes


def test_summaries_are_bounded() -> None:
    raw = plain(SNAPSHOTS[0])
    s = summarize(raw, max_blocks=3, max_trace=2)
    n_blocks = sum(len(seg["blocks"]) for seg in raw["segments"])
    assert len(s["blocks"]["address"]) == 3 and s["truncated_blocks"] == n_blocks - 3
    assert len(s["trace"]["action"]) == 2 and s["trace_actions"][s["trace"]["action"][-1]] == "oom"
    mm = memory_map_from_summary(s)
    assert mm.free_bytes == mm.reserved_bytes - mm.allocated_bytes  # estimated when blocks were cut


def test_damaged_rows_become_problems() -> None:
    good = snapshot_row(summarize(plain(SNAPSHOTS[0])), time=1.0, step=1, reason="requested")
    rows = [good,
            {**good, "step": 2, "data": b"not zlib"},
            {**good, "step": 3, "data": zlib.compress(b"{\"format\": \"other\"}")},
            {**good, "step": 4, "format": "gpudash-memmap-v99"},
            {**good, "step": 5, "data": None}]
    problems: list[str] = []
    maps = snapshots_from_frame(pd.DataFrame(rows), problems)
    assert [m.step for m in maps] == [1]
    assert len(problems) == 4 and all("snapshot (step" in p for p in problems)


# ---- hostile and malformed files ------------------------------------------------------------
class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}".encode()
    out = {f"reduce-proto{p}": pickle.dumps({"segments": [_Evil(marker)]}, protocol=p) for p in range(6)}
    out["global-opcode"] = b"cos\nsystem\n(S'" + cmd + b"'\ntR."
    out["inst-opcode"] = b"(S'" + cmd + b"'\nios\nsystem\n."
    out["stack-global"] = (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(cmd)]) + cmd + b"\x85R.")
    out["eval"] = b"cbuiltins\neval\n(S'__import__(\"os\").system(\"" + cmd + b"\")'\ntR."
    out["persistent-id"] = b"\x80\x02Pfoo\n."
    return out


class _ExtEvil:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> Any:
        return (os.system, (self.cmd,))


def test_hostile_pickles_are_refused_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    for name, data in _hostile_pickles(marker).items():
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(data)
        with pytest.raises(RunError) as ei:
            load_snapshot(path)
        msg = str(ei.value)
        assert "\n" not in msg, name
        assert "refused" in msg or "not a readable pickle" in msg, (name, msg)
        assert not marker.exists(), f"{name} executed code"
    # the same files through the CLI: one line, exit 2, nothing run
    run_dir = tmp_path / "run"
    for name in ("reduce-proto4", "global-opcode"):
        assert cli(["import-snapshot", str(tmp_path / f"{name}.pickle"), str(run_dir)]) == 2
    assert not marker.exists()
    assert not (run_dir / "rank0.db").exists()


def test_extension_registry_opcode_is_refused(tmp_path: Path) -> None:
    """EXT opcodes name a global through copyreg's registry; still a global, still refused."""
    marker = tmp_path / "PWNED"
    mod = os.system.__module__
    copyreg.add_extension(mod, "system", 0x7FF1)
    try:
        data = pickle.dumps(_ExtEvil(f"touch {marker}"), protocol=2)
        assert b"\x83" in data  # EXT2: the global comes from the registry
        path = tmp_path / "ext.pickle"
        path.write_bytes(data)
        with pytest.raises(RunError, match="refused"):
            load_snapshot(path)
    finally:
        copyreg.remove_extension(mod, "system", 0x7FF1)
    assert not marker.exists()


def test_a_plain_pickle_of_the_same_payload_would_have_run(tmp_path: Path) -> None:
    """Guard the guard: the marker mechanism works, so its absence above means something."""
    marker = tmp_path / "RAN"
    pickle.loads(pickle.dumps(_Evil(marker)))
    assert marker.exists()


def test_truncated_and_corrupted_files_fail_with_one_line(tmp_path: Path) -> None:
    data = SNAPSHOTS[0].read_bytes()
    rng = random.Random(3)
    cases = [data[:n] for n in range(0, len(data), max(1, len(data) // 60))]
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    cases += [b"", b"garbage", pickle.dumps([1, 2, 3]), pickle.dumps({"segments": "x"}),
              pickle.dumps({"segments": [{"blocks": "x"}]}), pickle.dumps({"segments": [{"address": "x"}]}),
              pickle.dumps({"segments": [1]}), pickle.dumps({"device_traces": [[{"size": [1]}]]}),
              pickle.dumps({"other": 1})]
    path = tmp_path / "f.pickle"
    ok = 0
    for data_i in cases:
        path.write_bytes(data_i)
        try:
            mm = load_snapshot(path)
        except RunError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
        else:
            ok += 1  # a flip inside a number can still be a valid snapshot
            assert isinstance(mm.reserved_bytes, int)
    assert ok < len(cases)


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such snapshot file"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(RunError, match="directory"):
        load_snapshot(tmp_path)


# ---- gpudash import-snapshot ------------------------------------------------------------------
def test_import_into_a_new_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "imported"
    assert cli(["import-snapshot", str(SNAPSHOTS[0]), str(run_dir), "--step", "12"]) == 0
    assert "3 segments" in capsys.readouterr().out
    run = gpudash.load_run(run_dir)
    assert run.status == "finished"
    (mm,) = run.snapshots
    assert mm.step == 12 and mm.reason == "imported snapshot_synthetic.pickle"
    assert mm.reserved_bytes == load_snapshot(SNAPSHOTS[0]).reserved_bytes
    assert mm.trace is not None


def test_import_into_an_existing_run_keeps_its_meta(tmp_path: Path, train_tiny: Any) -> None:
    run_dir = tmp_path / "trained"
    train_tiny(run_dir, steps=3)
    before = gpudash.load_run(run_dir)
    assert cli(["import-snapshot", str(SNAPSHOTS[1]), str(run_dir), "--reason", "from colleague"]) == 0
    after = gpudash.load_run(run_dir)
    assert after.status == before.status == "finished"
    assert after.rank_meta[0]["pid"] == before.rank_meta[0]["pid"]
    assert len(after.steps) == 3
    assert [m.reason for m in after.snapshots] == ["from colleague"]


def test_import_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["import-snapshot", str(tmp_path / "missing.pickle"), str(tmp_path / "r")]) == 2
    f = tmp_path / "file"
    f.write_text("x")
    assert cli(["import-snapshot", str(SNAPSHOTS[0]), str(f)]) == 2
    bad_db = tmp_path / "bad"
    bad_db.mkdir()
    (bad_db / "rank0.db").write_bytes(b"not sqlite at all" * 100)
    assert cli(["import-snapshot", str(SNAPSHOTS[0]), str(bad_db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gpudash: error:") for line in err)


def test_snapshots_table_is_plain_sqlite(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    assert cli(["import-snapshot", str(SNAPSHOTS[0]), str(run_dir)]) == 0
    with sqlite3.connect(run_dir / "rank0.db") as conn:
        fmt, data = conn.execute("select format, data from snapshots").fetchone()
    assert fmt == SUMMARY_FORMAT
    assert decode_summary(data)["segments"]["total_size"]
    assert io.BytesIO(data).read(2)  # a zlib stream, readable without gpudash
