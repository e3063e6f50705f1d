"""Recording into an object store: a real S3 protocol server (moto's standalone server, real HTTP) with
s3fs as the client, configured only through the environment (AWS_ENDPOINT_URL, AWS_*), as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs", reason="object-store tests need s3fs (pip install 'gpudash[s3]')")
moto_server = pytest.importorskip("moto.server", reason="object-store tests need moto[server] (dev extra)")

from helpers.s3 import bucket as _bucket  # noqa: E402
from helpers.s3 import free_port as _free_port  # noqa: E402

from gpudash import load_run  # noqa: E402
from gpudash.errors import RunError  # noqa: E402
from gpudash.monitor import Monitor  # noqa: E402
from gpudash.store.objstore import open_store  # noqa: E402


def _record(mon: Monitor, steps: range) -> None:
    for i in steps:
        with mon.step(samples=4):
            mon.log(loss=1.0 / (i + 1))


def _load_elsewhere(url: str) -> dict[str, object]:
    """load_run in another process (a dashboard host): what it sees."""
    code = ("import json, sys\nfrom gpudash import load_run\nr = load_run(sys.argv[1])\n"
            "print(json.dumps({'status': r.status, 'steps': r.steps['step'].tolist(), 'ranks': r.ranks, "
            "'name': r.name, 'problems': r.problems}))\n")
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_run_recorded_into_s3_is_read_live_elsewhere_and_after(s3: str, tmp_path: Path) -> None:
    _bucket("runs")
    url = "s3://runs/team/exp1"
    with Monitor(url, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        assert mon.name == "exp1" and mon.url == url
        _record(mon, range(5))
        pub = mon.recorder._publisher
        assert mon.recorder.flush() and pub is not None and pub.uploaded(20)
        live = _load_elsewhere(url)
        assert live["status"] == "live" and live["steps"] == list(range(5)) and live["name"] == "exp1"
        _record(mon, range(5, 12))
        assert mon.recorder.flush() and pub.uploaded(20)
        assert _load_elsewhere(url)["steps"] == list(range(12))
        staging = pub.live_dir
    assert not staging.exists()  # everything is in the bucket: the local copy is gone
    done = _load_elsewhere(url)
    assert done["status"] == "finished" and done["steps"] == list(range(12)) and done["problems"] == []
    names = open_store(url).find("segments")
    assert "segments/rank=0/steps/000000000000-000000000012.parquet" in names  # one file per table at the end
    assert len([n for n in names if "/steps/" in n]) == 1


def test_ranks_on_several_nodes_publish_into_one_run(s3: str) -> None:
    _bucket("runs")
    url = "s3://runs/ddp"
    mons = [Monitor(url, rank=r, world_size=2, flush_interval=0.05, host_hz=0.0, handle_signals=False)
            for r in (0, 1)]
    try:
        for r, mon in enumerate(mons):
            _record(mon, range(3 + r))
    finally:
        for mon in mons:
            mon.close()
    run = load_run(url)
    try:
        assert run.ranks == [0, 1] and run.status == "finished"
        assert sorted(run.steps.groupby("rank")["step"].count().tolist()) == [3, 4]
    finally:
        run.close()
    duckdb = pytest.importorskip("duckdb")
    local = run.path.parent / "copy"  # the README's query, on the bucket's files copied as they are
    open_store(url).fs.get(open_store(url).root + "/segments", str(local / "segments"), recursive=True)
    rows = duckdb.sql(f"SELECT rank, count(*) FROM read_parquet('{local}/segments/*/steps/*.parquet', "
                      "hive_partitioning = true, union_by_name = true) GROUP BY rank ORDER BY rank").fetchall()
    assert rows == [(0, 3), (1, 4)]


def test_a_store_that_refuses_writes_for_a_while_loses_nothing(s3: str) -> None:
    """The bucket does not exist yet: every upload is refused (NoSuchBucket) and recording goes on; once
    it exists the uploads resume, the outage is an event of the run, and every record arrives."""
    url = "s3://late/exp"
    with Monitor(url, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        _record(mon, range(4))
        pub = mon.recorder._publisher
        assert mon.recorder.flush() and pub is not None
        # the uploader's first refusal, said once (waited for, not timed: a loaded machine runs it late)
        deadline = time.monotonic() + 60
        while not [e for e in mon.recorder.errors if "cannot upload" in e] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pub.failing is not None and [e for e in mon.recorder.errors if "cannot upload" in e]
        assert not pub.uploaded(0.2)
        _record(mon, range(4, 9))
        mon.recorder.flush()
        _bucket("late")
        assert pub.uploaded(60) and pub.failing is None  # (returns as soon as all is up)
    run = load_run(url)
    try:
        assert run.status == "finished" and list(run.steps["step"]) == list(range(9))
        messages = run.events.loc[run.events["kind"] == "publish", "message"].tolist()
        assert any("cannot upload" in m for m in messages) and any("resumed" in m for m in messages)
    finally:
        run.close()


def test_an_unreachable_store_never_raises_into_the_loop(s3: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nobody listens there
    with Monitor("s3://nowhere/exp", flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        _record(mon, range(3))
        mon.recorder.flush()
        pub = mon.recorder._publisher
        assert pub is not None and not pub.uploaded(1.0)
        live_db = pub.live_path
    err = capsys.readouterr().err
    assert "cannot upload" in err and "could not be published" in err and str(live_db) in err
    assert live_db.exists()  # every record is still on local disk, and named


def test_a_missing_run_in_a_bucket_is_one_clear_line(s3: str) -> None:
    _bucket("runs")
    with pytest.raises(RunError, match="not a gpudash run"):
        load_run("s3://runs/nothing-here")


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _until(check: Any, seconds: float = 60.0) -> Any:
    import time

    end = time.monotonic() + seconds
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got or time.monotonic() > end:
            return got
        time.sleep(0.3)


def test_serve_an_s3_prefix_shows_a_live_run_then_its_end(s3: str, tmp_path: Path) -> None:
    """``gpudash serve s3://bucket/prefix`` in another process: the run recorded into the bucket is listed live,
    its summary answers from its segments, and it turns finished when the run ends."""
    _bucket("runs")
    url = "s3://runs/team/exp1"
    port = _free_port()
    mon = Monitor(url, flush_interval=0.05, host_hz=0.0, handle_signals=False)
    server = None
    try:
        _record(mon, range(6))
        pub = mon.recorder._publisher
        assert mon.recorder.flush() and pub is not None and pub.uploaded(20)
        server = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", "s3://runs/team", "--port", str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        api = f"http://127.0.0.1:{port}/api/runs"

        def listed(status: str) -> Any:
            runs = _get_json(api)["runs"]
            return runs if runs and runs[0]["id"] == "exp1" and runs[0]["status"] == status else None

        assert _until(lambda: listed("live")), _get_json(api)
        summary = _get_json(f"{api}/exp1/summary")
        assert summary["meta"]["name"] == "exp1" and summary["meta"]["segments"] is True
    finally:
        mon.close()
    try:
        assert _until(lambda: listed("finished")), _get_json(api)
    finally:
        assert server is not None
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert "serving s3://runs/team" in out


def test_gpudash_run_records_an_unchanged_script_into_s3(s3: str, tmp_path: Path) -> None:
    """``gpudash run --run-dir s3://...``: the unchanged example script is recorded into the bucket."""
    pytest.importorskip("torch")
    import os

    root = Path(__file__).resolve().parents[2]
    _bucket("runs")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    proc = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", "s3://runs/plain", "--",
                           sys.executable, str(root / "examples" / "unchanged" / "train_plain.py"), "--steps", "4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "recording into s3://runs/plain" in proc.stderr
    run = load_run("s3://runs/plain")
    try:
        assert run.status == "finished" and list(run.steps["step"]) == [0, 1, 2, 3] and run.name == "plain"
    finally:
        run.close()
