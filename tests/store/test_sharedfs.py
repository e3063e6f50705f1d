"""Shared-filesystem safe mode: detection from /proc/self/mountinfo, the live database on local storage,
its new rows published into the run folder as append-only segments, readers that follow them; on a real
FUSE mount (bindfs) and by forcing the mode. Object stores: tests/store/test_objstore.py."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from gpudash import load_run
from gpudash.monitor import Monitor
from gpudash.store import mirror, publish, sharedfs
from gpudash.store.reader import RankReader, RunReader
from gpudash.store.segments import SEGMENTS_DIR
from gpudash.store.sharedfs import mount_of, shared_mode

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /mnt/shared rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2
31 22 0:41 / /lustre rw - lustre 10.0.0.1@o2ib:/fs rw
32 22 0:42 / /home/u/remote rw,nosuid - fuse.sshfs u@host:/data rw,user_id=0
33 22 0:43 / /mnt/bind rw - fuse /srv/data rw,user_id=0
34 22 8:17 / /media/win rw - fuseblk /dev/sdb1 rw
35 22 0:44 / /mnt/my\\040share rw - cifs //nas/share rw
36 30 8:2 / /mnt/shared/local rw - xfs /dev/sdc1 rw
37 22 0:45 / /scratch rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(("path", "fstype"), [
    ("/mnt/shared/runs/a", "nfs4"), ("/lustre/x", "lustre"), ("/home/u/remote/runs", "fuse.sshfs"),
    ("/mnt/bind/r", "fuse"), ("/mnt/my share/runs", "cifs"), ("/mnt/shared/local/runs", None),
    ("/media/win/runs", None), ("/scratch/r", None), ("/home/u/runs", None), ("/mnt/sharedx/r", None),
])
def test_detects_shared_mounts_from_mountinfo(path: str, fstype: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sharedfs.SHARED_ENV, raising=False)
    why = shared_mode(path, MOUNTINFO)
    if fstype is None:
        assert why is None
    else:
        assert why is not None and f"a {fstype} mount" in why


def test_nearest_mount_wins_and_escapes_are_read() -> None:
    assert mount_of("/mnt/my share/r", MOUNTINFO) == ("/mnt/my share", "cifs", "//nas/share")
    assert mount_of("/mnt/shared/local/deep/er", MOUNTINFO)[1] == "xfs"  # type: ignore[index]


def test_env_forces_the_mode_either_way(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(sharedfs.SHARED_ENV, "0")
    assert shared_mode("/mnt/shared/runs", MOUNTINFO) is None
    monkeypatch.setenv(sharedfs.SHARED_ENV, "1")
    assert shared_mode(tmp_path, MOUNTINFO) == "GPUDASH_SHARED_FS=1"
    monkeypatch.delenv(sharedfs.SHARED_ENV)
    assert shared_mode(tmp_path, MOUNTINFO) is None  # tmp_path is on the root ext4 of the sample


def _record(mon: Monitor, steps: range) -> None:
    for i in steps:
        with mon.step(samples=4):
            mon.log(loss=1.0 / (i + 1))


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _segments(run_dir: Path, table: str = "steps") -> list[str]:
    return sorted(p.name for p in (run_dir / SEGMENTS_DIR / "rank=0" / table).iterdir())


def _run_in_shared_mode(run_dir: Path, local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(local))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)  # publish at every flush: the test waits for none
    monkeypatch.setattr(mirror, "SYNC_S", 0.0)  # readers list the segments at every refresh
    mon = Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False)
    try:
        pub = mon.recorder._publisher
        assert pub is not None
        live = pub.live_path
        assert live.parent.parent == local
        _record(mon, range(5))
        assert mon.recorder.flush() and pub.uploaded(10)
        # the run folder holds no database: immutable segments and the rank's meta
        assert _files(run_dir) == {"run.json", SEGMENTS_DIR}
        assert _files(run_dir / SEGMENTS_DIR / "rank=0") >= {"meta.json", "steps", "events"}
        first = _segments(run_dir)
        assert live.exists()
        reader = RunReader(run_dir)
        try:
            assert reader.status() == "live"
            meta = reader.rank_meta()[0]
            assert meta["live_db"] == str(live) and meta["publish_interval"] == 0.0
            assert list(reader.read_table("steps")["step"]) == list(range(5))
            _record(mon, range(5, 9))
            assert mon.recorder.flush() and pub.uploaded(10)
            # append-only: the files published before are still there, unchanged; one more holds the new rows
            later = _segments(run_dir)
            assert set(first) < set(later) and later[-1].endswith("-000000000009.parquet")
            reader.refresh()
            assert list(reader.read_table("steps")["step"]) == list(range(9))
            assert _files(run_dir) == {"run.json", SEGMENTS_DIR}  # the reader wrote nothing there
        finally:
            reader.close()
    finally:
        mon.close()
    assert not live.parent.exists()  # the store holds everything: the live copy is gone
    assert _segments(run_dir) == ["000000000000-000000000009.parquet"]  # compacted at the end of the run
    run = load_run(run_dir)
    try:
        assert run.status == "finished" and list(run.steps["step"]) == list(range(9))
        assert run.steps["loss"].notna().all()
    finally:
        run.close()


def test_forced_shared_mode_publishes_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sharedfs.SHARED_ENV, "1")
    _run_in_shared_mode(tmp_path / "run", tmp_path / "local", monkeypatch)


def test_a_copy_lagging_by_the_publish_interval_is_still_live(tmp_path: Path) -> None:
    db = tmp_path / "rank0.db"
    sqlite3.connect(db).close()
    r = RankReader(db)
    try:
        now = 1000.0
        meta = {"status": "live", "heartbeat": now - 6.0, "flush_interval": 0.5}
        assert r.status(meta, now) == "crashed"
        assert r.status({**meta, "publish_interval": 3.0}, now) == "live"
        assert r.status({**meta, "publish_interval": 3.0, "heartbeat": now - 10.0}, now) == "crashed"
    finally:
        r.close()


def test_old_whole_copy_runs_still_read(tmp_path: Path) -> None:
    """Runs published by earlier versions: a rollback-journal copy of each rank's database in the run folder."""
    run_dir = tmp_path / "run"
    with Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        _record(mon, range(4))
    with sqlite3.connect(run_dir / "rank0.db") as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    assert _files(run_dir) == {"run.json", "rank0.db"}
    run = load_run(run_dir)
    try:
        assert run.status == "finished" and list(run.steps["step"]) == list(range(4))
    finally:
        run.close()


def test_a_failed_publish_is_said_once_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(sharedfs.SHARED_ENV, "1")
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(publish, "RETRY_S", 0.05)
    from gpudash.store.objstore import Store

    real = Store.put
    fails = {"n": 3}

    def flaky(self: Store, name: str, data: bytes) -> None:
        if fails["n"]:
            fails["n"] -= 1
            raise OSError(28, "No space left on device")
        real(self, name, data)

    monkeypatch.setattr(Store, "put", flaky)
    run_dir = tmp_path / "run"
    with Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        _record(mon, range(3))
        mon.recorder.flush()
        pub = mon.recorder._publisher
        assert pub is not None and pub.uploaded(10)
        failing = [e for e in mon.recorder.errors if "cannot upload" in e]
        assert len(failing) == 1 and "No space left on device" in failing[0]
        assert any("resumed" in e and "nothing was lost" in e for e in mon.recorder.errors)
        _record(mon, range(3, 6))
    assert capsys.readouterr().err.count("cannot upload") == 1
    run = load_run(run_dir)
    try:
        assert run.status == "finished" and len(run.steps) == 6
        assert {"publish"} <= set(run.events["kind"])  # the outage is in the run, for every reader
    finally:
        run.close()
    assert not any((tmp_path / "local").iterdir())


def _umount(mnt: Path) -> None:
    for cmd in (["fusermount3", "-u", str(mnt)], ["fusermount", "-u", str(mnt)], ["umount", str(mnt)]):
        if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
            return


def test_real_fuse_mount_is_detected_and_recorded_safely(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bindfs (Debian's ``bindfs`` package) mounts a folder through FUSE, as sshfs, gcsfuse or a cluster
    filesystem client would: the mode turns on by itself and the backing folder never sees a live WAL."""
    if shutil.which("bindfs") is None:
        pytest.skip("bindfs is not installed (apt-get install bindfs): no FUSE filesystem to mount")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing: FUSE mounts are not possible here")
    src, mnt = tmp_path / "backing", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    proc = subprocess.run(["bindfs", str(src), str(mnt)], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"bindfs could not mount (needs root or fuse permissions): {proc.stderr.strip()[:200]}")
    try:
        for _ in range(100):  # the mount shows up in mountinfo once bindfs has daemonized
            if os.path.ismount(mnt):
                break
            time.sleep(0.05)
        monkeypatch.delenv(sharedfs.SHARED_ENV, raising=False)
        why = shared_mode(mnt / "run")
        assert why is not None and "fuse" in why and str(mnt) in why
        _run_in_shared_mode(mnt / "run", tmp_path / "local", monkeypatch)
        assert _files(src / "run") == {"run.json", SEGMENTS_DIR}  # what other hosts would see
        run = load_run(src / "run")
        try:
            assert run.status == "finished" and len(run.steps) == 9
            assert "fuse" in str(run.rank_meta[0]["shared_fs"])
        finally:
            run.close()
    finally:
        _umount(mnt)


@pytest.mark.slow
def test_a_killed_rank_leaves_its_segments_and_the_full_live_database(tmp_path: Path) -> None:
    """SIGKILL: the run folder keeps every segment published (read as crashed, the gap named); the live
    database on local storage keeps every record, and the published meta says where it is."""
    import signal
    import sys

    script = (
        "import sys, time\n"
        "import gpudash.store.publish as p\n"
        "p.PUBLISH_INTERVAL_S = 0.0\n"
        "from gpudash.monitor import Monitor\n"
        "mon = Monitor(sys.argv[1], flush_interval=0.05, host_hz=0.0, handle_signals=False)\n"
        "for i in range(5):\n"
        "    with mon.step():\n"
        "        mon.log(loss=1.0)\n"
        "mon.recorder.flush()\n"
        "assert mon.recorder._publisher.uploaded(20)\n"
        "p.PUBLISH_INTERVAL_S = 3600.0\n"
        "mon.recorder._publisher.interval = 3600.0\n"
        "for i in range(5, 8):\n"
        "    with mon.step():\n"
        "        mon.log(loss=1.0)\n"
        "mon.recorder.flush()\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, sharedfs.SHARED_ENV: "1", sharedfs.LOCAL_DIR_ENV: str(tmp_path / "local")}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    run = load_run(run_dir)
    try:
        assert run.status == "crashed" and list(run.steps["step"]) == list(range(5))
        live = Path(run.rank_meta[0]["live_db"])
        assert any("stopped publishing" in p and str(live) in p for p in run.problems)
    finally:
        run.close()
    assert live.exists() and live.parent.parent == tmp_path / "local"
    with sqlite3.connect(f"file:{live}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 8


def test_damaged_node_and_publish_meta_is_ignored_not_fatal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        _record(mon, range(2))
        mon.recorder.put_meta(status="live", publish_interval="soon", node=7, local_rank=-1)
        mon.recorder.flush()
        reader = RunReader(run_dir)
        try:
            assert reader.status() == "live"  # not a crash on the bad interval
            meta = reader.rank_meta()[0]
            assert "publish_interval" not in meta and "node" not in meta and "local_rank" not in meta
            assert any("publish_interval is 'soon'" in p for p in reader.all_problems())
        finally:
            reader.close()


def test_segments_are_merged_as_the_run_goes_and_readers_keep_every_row(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every MERGE_EVERY segments of a table become one (put before the small ones go): a reader that
    followed the small ones and one that opens the run afresh both see every row, once, in order."""
    monkeypatch.setenv(sharedfs.SHARED_ENV, "1")
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(publish, "MERGE_EVERY", 3)
    monkeypatch.setattr(mirror, "SYNC_S", 0.0)
    run_dir = tmp_path / "run"
    with Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        pub = mon.recorder._publisher
        assert pub is not None
        follower = None
        try:
            for i in range(10):
                _record(mon, range(i * 3, i * 3 + 3))
                assert mon.recorder.flush() and pub.uploaded(10)
                if follower is None:
                    follower = RunReader(run_dir)
                follower.refresh()
                assert list(follower.read_table("steps")["step"]) == list(range(i * 3 + 3))
            names = _segments(run_dir)
            assert len(names) < 10  # merged as it went: not one file per publish
            spans = [tuple(int(x) for x in n.removesuffix(".parquet").split("-")) for n in names]
            assert spans[0][0] == 0 and spans[-1][1] == 30
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # one chain, no overlap
            fresh = RunReader(run_dir)
            try:
                assert list(fresh.read_table("steps")["step"]) == list(range(30))
            finally:
                fresh.close()
        finally:
            if follower is not None:
                follower.close()
    assert _segments(run_dir) == ["000000000000-000000000030.parquet"]


def test_a_damaged_segment_is_named_and_the_rows_before_it_shown(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment that is not Parquet (truncated, overwritten by someone): the reader says which, shows the
    rows before it, and nothing raises; the merge at the end of the run replaces it from the live database."""
    monkeypatch.setenv(sharedfs.SHARED_ENV, "1")
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(publish, "MERGE_EVERY", 1000)
    run_dir = tmp_path / "run"
    mon = Monitor(run_dir, flush_interval=0.05, host_hz=0.0, handle_signals=False)
    pub = mon.recorder._publisher
    assert pub is not None
    for i in range(3):
        _record(mon, range(i * 2, i * 2 + 2))
        assert mon.recorder.flush() and pub.uploaded(10)
    names = _segments(run_dir)
    second = run_dir / SEGMENTS_DIR / "rank=0" / "steps" / names[1]
    second.write_bytes(second.read_bytes()[:40])
    run = load_run(run_dir)
    try:
        assert list(run.steps["step"]) == list(range(int(names[0].split("-")[1][:12])))
        assert any(names[1] in p and "not a readable Parquet file" in p for p in run.problems)
    finally:
        run.close()
        mon.close()
    run = load_run(run_dir)  # the merge at the end wrote every row again from the live database
    try:
        assert list(run.steps["step"]) == list(range(6)) and run.problems == []
    finally:
        run.close()
