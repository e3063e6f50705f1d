"""Snapshot files built to cost: shared references and huge numbers (issue 12, items 8-9).

A pickle can point at one list from thousands of places, so a 16 KB file can
describe sixteen million blocks; and it can hold integers no allocator writes.
Reading either ends in one line naming the problem and the fix, never in
minutes of work, gigabytes of memory or a raw ``OverflowError``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash.errors import RunError
from gpudash.store import load_run
from gpudash.store.snapshot import (
    MAX_NODES,
    SUMMARY_FORMAT,
    SUMMARY_FORMAT_V1,
    decode_summary,
    encode_summary,
    load_snapshot,
    memory_map_from_summary,
    snapshots_from_frame,
    summarize,
)
from gpudash.store.writer import Recorder

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"


def _write(path: Path, snap: Any) -> Path:
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _shared_blocks() -> dict[str, Any]:
    """4,000 segments that all reference one list of 4,000 blocks (memoised once in the pickle)."""
    blocks = [{"size": 512, "state": "active_allocated"} for _ in range(4000)]
    return {"segments": [{"address": 0, "blocks": blocks} for _ in range(4000)]}


def _shared_frames() -> dict[str, Any]:
    frames = [{"filename": "/torch/x.py", "line": 1, "name": "f"}] * 4000
    entry = {"action": "alloc", "addr": 0, "size": 512, "frames": frames}
    return {"segments": [], "device_traces": [[entry] * 4000]}


def _shared_settings() -> dict[str, Any]:
    level: Any = 1
    for _ in range(6):
        level = [level] * 100  # 100**6 leaves, a few hundred bytes pickled
    return {"segments": [], "allocator_settings": {"x": level}}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


# ---- 8. shared references: bounded work, said so --------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [_shared_blocks, _shared_frames, _shared_settings], ids=lambda f: f.__name__)
def test_shared_references_hit_the_budget(make: Any, tmp_path: Path) -> None:
    path = _write(tmp_path / "shared.pickle", make())
    assert path.stat().st_size < 200_000
    with pytest.raises(RunError) as err:
        load_snapshot(path)
    msg = str(err.value)
    budget = MAX_NODES + path.stat().st_size  # node_budget: one node per byte of the file on top
    assert "\n" not in msg and f"{budget:,}" in msg
    assert "max_nodes" in msg and "--max-nodes" in msg  # the fix is named


@pytest.mark.timeout(120)
def test_import_snapshot_of_shared_references_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "shared.pickle", _shared_blocks())
    out = _cli("import-snapshot", str(path), str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "--max-nodes" in out.stderr
    assert not (tmp_path / "run").exists()


def test_budget_is_a_count_of_nodes_not_bytes(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="over 1,000 segments"):
        load_snapshot(REAL, max_nodes=1000)
    out = _cli("import-snapshot", str(REAL), str(tmp_path / "run"), "--max-nodes", "1000", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr


def test_real_snapshot_still_loads_fully(tmp_path: Path) -> None:
    # the figures in tests/fixtures/real-snapshot/README.md, computed from the raw pickle
    mm = load_snapshot(REAL)
    assert len(mm.segments) == 216 and len(mm.blocks) == 455
    assert mm.reserved_bytes == 14_180_941_824 and mm.allocated_bytes == 1_377_753_600
    assert mm.largest_free_bytes == 329_252_864
    assert mm.trace is not None and len(mm.trace) == 5163
    assert mm.trace["action"].value_counts().to_dict() == {"alloc": 1721, "free_requested": 1721,
                                                         "free_completed": 1721}
    out = _cli("import-snapshot", str(REAL), str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [stored] = load_run(tmp_path / "run").snapshots
    assert stored.reserved_bytes == mm.reserved_bytes and len(stored.blocks) == 455


# ---- 9. huge integers -------------------------------------------------------------------------
HUGE = [2**63, 2**64, -(2**63) - 1, 10**5000]


def _with(value: int, where: str) -> dict[str, Any]:
    block = {"size": 512, "state": "active_allocated", "frames": [{"filename": "/a.py", "line": 1, "name": "f"}]}
    seg: dict[str, Any] = {"address": 0, "blocks": [block]}
    snap: dict[str, Any] = {"segments": [seg]}
    if where == "segment":
        seg["total_size"] = value
    elif where == "block":
        block["size"] = value
    elif where == "trace":
        snap["device_traces"] = [[{"action": "alloc", "addr": value, "size": 1}]]
    elif where == "sum":  # each size fits in 64 bits, their sum does not
        seg["blocks"] = [dict(block, size=2**62) for _ in range(3)]
    return snap


@pytest.mark.parametrize("value", HUGE, ids=["2^63", "2^64", "-2^63-1", "5001 digits"])
@pytest.mark.parametrize("where", ["segment", "block", "trace"])
def test_huge_sizes_are_a_one_line_error(value: int, where: str, tmp_path: Path) -> None:
    path = _write(tmp_path / "big.pickle", _with(value, where))
    with pytest.raises(RunError, match="does not fit in 64 bits") as err:
        load_snapshot(path)
    assert "\n" not in str(err.value)
    if where != "block":
        return  # the command line: once per value is enough
    out = _cli("import-snapshot", str(path), str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "does not fit in 64 bits" in out.stderr


def test_sizes_that_fit_but_whose_sum_does_not(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="does not fit in 64 bits"):
        load_snapshot(_write(tmp_path / "sum.pickle", _with(0, "sum")))


@pytest.mark.parametrize("value", HUGE, ids=["2^63", "2^64", "-2^63-1", "5001 digits"])
def test_huge_labels_and_settings_are_clamped(value: int, tmp_path: Path) -> None:
    snap = _with(1, "none")
    snap["segments"][0]["blocks"][0]["frames"][0]["line"] = value
    snap["segments"][0]["blocks"][0]["state"] = value
    snap["allocator_settings"] = {"n": value, "ok": 3}
    mm = load_snapshot(_write(tmp_path / "big.pickle", snap))
    assert mm.blocks["frame"].tolist() == ["/a.py:<huge number> f"]
    assert mm.blocks["state"].tolist() == ["<huge number>"]
    assert mm.allocator_settings == {"n": "<huge number>", "ok": 3}


def _stored_run(tmp_path: Path, summaries: list[Any], step: float | None = 1) -> Path:
    run_dir = tmp_path / "run"
    rec = Recorder(run_dir, flush_interval=60)
    for s in summaries:
        data = s if isinstance(s, bytes) else encode_summary(s)
        rec.put("snapshots", {"time": 1e9, "step": step, "reason": "r", "format": SUMMARY_FORMAT, "data": data})
    rec.close()
    return run_dir


def test_stored_summary_with_huge_numbers_is_named_not_raised(tmp_path: Path) -> None:
    good = summarize(_with(1, "none"))
    bad = {**good, "segments": {**good["segments"], "total_size": [2**64]}}
    run_dir = _stored_run(tmp_path, [good, bad, b"\x78\x9c" + b"[" * 5])
    run = load_run(run_dir)
    maps = run.snapshots
    assert len(maps) == 1 and maps[0].reserved_bytes == 512
    assert sum("unreadable" in p for p in run.problems) == 2


def test_stored_snapshot_with_infinite_step_is_read(tmp_path: Path) -> None:
    run = load_run(_stored_run(tmp_path, [summarize(_with(1, "none"))], step=float("inf")))
    [mm] = run.snapshots
    assert mm.step is None


# ---- property tests: snapshot dicts and stored summaries of any shape ----------------------------
# 10**5000 is built lazily: hypothesis cannot even print a strategy that holds it
_scalar = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
           | st.integers(2**63, 2**64) | st.integers(max_value=-(2**63) - 1) | st.builds(lambda: 10**5000))
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


def _shaped(keys: tuple[str, ...], children: dict[str, st.SearchStrategy[Any]] | None = None
            ) -> st.SearchStrategy[Any]:
    """Dicts with any subset of the documented keys, each holding a plausible or an arbitrary value."""
    children = children or {}
    fields = {k: (children[k] | _value) if k in children else _value for k in keys}
    return st.fixed_dictionaries({}, optional=fields) | _value


_frame = _shaped(("filename", "line", "name"))
_frames = st.lists(_frame, max_size=3)
_block = _shaped(("address", "size", "requested_size", "state", "frames"), {"frames": _frames})
_segment = _shaped(("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                    "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"),
                   {"blocks": st.lists(_block, max_size=3), "frames": _frames})
_entry = _shaped(("action", "addr", "size", "stream", "frames", "time_us", "device_free"), {"frames": _frames})
_snapshot = st.fixed_dictionaries({"segments": st.lists(_segment, max_size=3) | _value}, optional={
    "device_traces": st.lists(st.lists(_entry, max_size=3) | _value, max_size=2) | _value,
    "allocator_settings": _value,
})


@settings(max_examples=200, deadline=None)
@given(snap=_snapshot)
def test_any_snapshot_dict_summarises_or_says_why(snap: dict[str, Any]) -> None:
    try:
        summary = summarize(snap)
    except RunError as exc:
        assert "\n" not in str(exc)
        return
    mm = memory_map_from_summary(decode_summary(encode_summary(summary)))
    assert len(mm.segments) == len(snap["segments"] or [])
    for df in (mm.segments, mm.blocks):
        for c in df.columns:
            if c not in ("state", "frame", "stack", "segment_type", "is_expandable"):
                assert df[c].dtype == "int64", c


_summary = st.fixed_dictionaries({"format": st.just(SUMMARY_FORMAT_V1)}, optional={
    "segments": st.dictionaries(st.sampled_from(["address", "total_size", "allocated_size", "blocks"]),
                                st.lists(_scalar, max_size=2), max_size=4) | _value,
    "blocks": st.dictionaries(st.sampled_from(["address", "size", "state", "frame"]),
                              st.lists(_scalar, max_size=2), max_size=4) | _value,
    "frames": st.lists(_scalar, max_size=3) | _value,
    "trace": _value,
    "truncated_blocks": _value,
    "truncated_trace": _value,
    "allocator_settings": _value,
})


@settings(max_examples=200, deadline=None)
@given(summary=_summary, step=st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats())
def test_any_stored_summary_reads_or_is_named(summary: dict[str, Any], step: Any) -> None:
    try:
        data = zlib.compress(json.dumps(summary).encode())
    except ValueError:  # a >4,300-digit integer cannot even be written as JSON
        return
    df = pd.DataFrame([{"rank": 0, "time": 1e9, "step": step, "reason": "r", "format": SUMMARY_FORMAT_V1,
                        "data": data}])
    problems: list[str] = []
    maps = snapshots_from_frame(df, problems)
    assert len(maps) + len(problems) == 1
    assert all("\n" not in p for p in problems)


_GOOD_V2 = encode_summary(summarize({"segments": [{"address": 0, "blocks": [{"size": 512, "state": "active_allocated",
                                                                       "frames": [{"filename": "/a.py", "line": 1,
                                                                                   "name": "f"}]}]}],
                                     "device_traces": [[{"action": "alloc", "addr": 0, "size": 512}] * 3]}))


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(_GOOD_V2) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.none() | st.integers(0, len(_GOOD_V2)))
def test_any_damaged_columnar_summary_reads_or_is_named(edits: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray(_GOOD_V2)
    for at, byte in edits:
        data[at] = byte
    df = pd.DataFrame([{"rank": 0, "time": 1e9, "step": 1, "reason": "r", "format": SUMMARY_FORMAT,
                        "data": bytes(data[:cut])}])
    problems: list[str] = []
    maps = snapshots_from_frame(df, problems)
    assert len(maps) + len(problems) == 1
    assert all("\n" not in p and "unreadable ()" not in p for p in problems)
