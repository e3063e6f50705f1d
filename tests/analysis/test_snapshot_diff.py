"""The snapshot diff: what grew from A to B and by which frames, the same in the analysis, the CLI's text
and its --json, and the run page's diff view."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.analysis.snapshot_diff import NO_FRAMES, largest_live, snapshot_diff
from gpudash.cli import main as cli
from gpudash.store.snapshot import memory_map_from_summary, summarize

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"
MiB = 1 << 20


def _frames(line: int) -> list[dict[str, Any]]:
    return [{"filename": "/home/me/train.py", "line": line, "name": "step"}]


def _snap(blocks: list[tuple[int, str, int | None]]) -> dict[str, Any]:
    out, off = [], 0
    for size, state, line in blocks:
        out.append({"address": off, "size": size, "requested_size": size, "state": state,
                    "frames": _frames(line) if line is not None else []})
        off += size
    return {"segments": [{"address": 0, "total_size": off, "blocks": out}]}


def _map(raw: dict[str, Any], step: int) -> Any:
    return memory_map_from_summary(summarize(raw), step=step, reason="test")


A = _snap([(4 * MiB, "active_allocated", 10), (2 * MiB, "active_allocated", 20), (8 * MiB, "inactive", None)])
B = _snap([(4 * MiB, "active_allocated", 10), (4 * MiB, "active_allocated", 30), (2 * MiB, "active_allocated", 30),
           (1 * MiB, "active_allocated", None), (3 * MiB, "inactive", None)])


def test_what_grew_and_by_which_frames() -> None:
    d = snapshot_diff(_map(A, 1), _map(B, 2))
    assert d.allocated_delta == (11 - 6) * MiB and d.reserved_delta == 0
    by = {r.top: r for r in d.rows}
    assert by["/home/me/train.py:30 step"].delta_bytes == 6 * MiB and by["/home/me/train.py:30 step"].after_count == 2
    assert by[NO_FRAMES].delta_bytes == 1 * MiB
    assert by["/home/me/train.py:20 step"].delta_bytes == -2 * MiB
    assert "/home/me/train.py:10 step" not in by  # unchanged
    assert [r.delta_bytes for r in d.rows] == [6 * MiB, 1 * MiB, -2 * MiB]  # grown first, then shrunk
    assert d.grown_bytes - d.shrunk_bytes == d.allocated_delta
    assert (d.before.free_bytes, d.after.free_bytes) == (8 * MiB, 3 * MiB)
    assert largest_live(_map(B, 2), 2)[0].size == 4 * MiB


def test_the_real_snapshot_against_itself_grown() -> None:
    raw = pickle.loads(REAL.read_bytes())  # our own fixture: trusted
    grown = copy.deepcopy(raw)
    seg = grown["segments"][0]
    seg["blocks"].append({"address": seg["address"] + seg["total_size"], "size": 64 * MiB, "requested_size": 64 * MiB,
                          "state": "active_allocated", "frames": raw["device_traces"][0][5]["frames"]})
    for k in ("total_size", "allocated_size", "active_size", "requested_size"):
        seg[k] += 64 * MiB
    d = snapshot_diff(_map(raw, 1), _map(grown, 2))
    assert d.allocated_delta == 64 * MiB and d.rows[0].delta_bytes == 64 * MiB and len(d.rows) == 1
    assert "model.py:" in d.rows[0].stack


AGENT = str(Path(gpudash.__file__).resolve().parent / "zerocode" / "agent.py")  # gpudash run's wrapper


def _wrapped(line: int, top: str = AGENT) -> list[dict[str, Any]]:
    """A stack as ``gpudash run`` records it: torch's module call, gpudash's wrapper of the model's call (or
    ``top``), then the user's loop."""
    return [{"filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", "line": 1750,
             "name": "_call_impl"},
            {"filename": top, "line": 132, "name": "__call__"},
            {"filename": "/home/me/keep_losses.py", "line": line, "name": "main"},
            {"filename": "/home/me/keep_losses.py", "line": 62, "name": "<module>"}]


def test_gpudash_frames_on_top_are_never_the_named_frame() -> None:
    """The H200 run of keep_losses.py under ``gpudash run``: the most grown stack was named
    ``gpudash/zerocode/agent.py:132 __call__``. gpudash's own frames on top are left out where the frames are
    chosen, so the diff, the largest allocations, the memory map's frame and the timeline name the user's line;
    a folder of the user's named gpudash is the user's; a stack of gpudash's frames alone keeps them."""
    def snap(n: int) -> dict[str, Any]:
        blocks = [{"address": i * MiB, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                   "frames": _wrapped(51)} for i in range(n)]
        blocks.append({"address": n * MiB, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                       "frames": _wrapped(49, top="/home/me/gpudash/model.py")})
        blocks.append({"address": (n + 1) * MiB, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                       "frames": [_wrapped(0)[1]]})
        trace = [{"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0, "frames": b["frames"]}
                 for b in blocks]
        return {"segments": [{"address": 0, "total_size": (n + 2) * MiB, "blocks": blocks}],
                "device_traces": [trace]}

    before, after = _map(snap(2), 1), _map(snap(6), 2)
    d = snapshot_diff(before, after)
    user = "/home/me/keep_losses.py:51 main"
    assert [(r.top, r.delta_bytes) for r in d.rows] == [(user, 4 * MiB)]
    assert d.rows[0].stack == f"{user}\n/home/me/keep_losses.py:62 <module>"
    assert "gpudash/zerocode" not in json.dumps(d.as_dict())
    tops = set(after.blocks["frame"].astype(str))
    assert tops == {user, "/home/me/gpudash/model.py:132 __call__", f"{AGENT}:132 __call__"}
    assert {a.stack.split("\n", 1)[0] for a in largest_live(after, 50)} == tops
    assert after.trace is not None and set(after.trace["frame"].astype(str)) == tops
    assert set(after.trace["stack"].astype(str)) == set(after.blocks["stack"].astype(str))


def test_the_cli_says_the_same_in_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"
    a.write_bytes(pickle.dumps(A))
    b.write_bytes(pickle.dumps(B))
    assert cli(["import-snapshot", str(a), str(tmp_path / "run"), "--step", "5"]) == 0
    assert cli(["import-snapshot", str(b), str(tmp_path / "run"), "--step", "9"]) == 0
    capsys.readouterr()
    assert cli(["diff-snapshots", f"{tmp_path / 'run'}@5", str(tmp_path / "run"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    want = snapshot_diff(_map(A, 5), _map(B, 9))
    assert data["allocated_delta_bytes"] == want.allocated_delta
    assert [s["delta_bytes"] for s in data["stacks"]] == [r.delta_bytes for r in want.rows]
    assert data["before"]["step"] == 5 and data["after"]["step"] == 9
    assert cli(["diff-snapshots", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "+6.0 MiB" in text and "train.py:30 step" in text and "allocated" in text


def test_the_cli_names_a_bad_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert cli(["diff-snapshots", str(tmp_path / "empty"), str(tmp_path / "missing.pickle")]) != 0
    err = capsys.readouterr().err
    assert "not a gpudash run" in err and len(err.strip().splitlines()) == 1
    a = tmp_path / "a.pickle"
    a.write_bytes(pickle.dumps(A))
    assert cli(["diff-snapshots", str(a), str(tmp_path / "missing.pickle")]) != 0
    err = capsys.readouterr().err
    assert "no such snapshot file" in err and len(err.strip().splitlines()) == 1
    assert cli(["diff-snapshots", f"{a}@3", str(a)]) != 0
    assert "@STEP goes with a run directory" in capsys.readouterr().err
