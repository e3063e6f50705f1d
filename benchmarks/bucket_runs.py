"""A team's bucket of runs (issue 45): ``gpudash serve s3://bucket/runs`` against moto's S3 server.

    .venv/bin/python benchmarks/bucket_runs.py                       # N = 300 and 1,000
    .venv/bin/python benchmarks/bucket_runs.py --runs 300 --write    # also update benchmarks/RESULTS.md

One real run is recorded into the bucket (``Monitor("s3://runs/team/seed")``, ``--steps`` steps) and copied
to N runs under one prefix. Then ``gpudash serve s3://runs/team`` runs in another process, its temporary
folder a fresh one, and is measured as a user meets it: seconds from start until ``/api/runs`` lists all N
runs (``matching``), one ``/api/runs`` request (the runs page's listing), one run opened
(``/api/runs/<id>/summary``: its segments fetched), and the server's local disk (its temporary folder)
before and after that run was opened. The per-request costs (one listing of the prefix, one small object
read) are measured too, which put a bucket of 10,000 runs on paper. Also: a local folder of 1,000 small runs,
``/api/runs`` on a fresh server process (issue 45's "local speed").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import results  # noqa: E402  benchmarks/results.py, next to this script

from gpudash.store.runsync import FETCHERS  # noqa: E402

SECTION = "## A team's bucket, listed in memory (issue 45, listing side)"
PREFIX = "s3://runs/team"


def _get(url: str, timeout: float = 60) -> tuple[Any, float]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = json.loads(r.read())
    return body, time.perf_counter() - t


def _du(folder: Path) -> int:
    """Bytes of the files under ``folder`` (their allocated blocks)."""
    total = 0
    for p in folder.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        total += st.st_blocks * 512
    return total


def start_moto() -> tuple[Any, str]:
    from helpers.s3 import free_port
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    return server, endpoint


def seed_bucket(n: int, steps: int) -> tuple[int, int]:
    """The seed run recorded, then copied to run0000.. (puts many at once); (objects per run, bytes per run)."""
    from gpudash.monitor import Monitor
    from gpudash.store.objstore import open_store
    from gpudash.testing import ToyLoop

    store = open_store(PREFIX)
    if not store.fs.exists("runs"):
        store.fs.mkdir("runs")
    seed = f"{PREFIX}/seed"
    if not open_store(seed).find(""):
        loop = ToyLoop(tokens_per_sample=8)
        with Monitor(seed, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
            mon.watch(loop.model, loop.opt)
            loop.train(mon, steps)
    src = open_store(seed)
    objects = {name: src.get(name) for name in src.find("")}
    have = set(store.folders(""))
    batch: dict[str, bytes] = {}
    for i in range(n):
        run = f"run{i:05d}"
        if run in have:
            continue
        for name, data in objects.items():
            batch[f"{store.root}/{run}/{name}"] = data
        if len(batch) > 2000:
            store.fs.pipe(batch)
            batch = {}
    if batch:
        store.fs.pipe(batch)
    return len(objects), sum(len(d) for d in objects.values())


def per_request_costs() -> dict[str, float]:
    """Seconds of one listing of the prefix (all objects), and of one small object read, in this process."""
    from gpudash.store.objstore import open_store

    store = open_store(PREFIX)
    t = time.perf_counter()
    store.fs.invalidate_cache()
    found = store.fs.find(store.root)
    listing = time.perf_counter() - t
    metas = [f for f in found if f.endswith("/meta.json")][:50]
    t = time.perf_counter()
    for f in metas:
        store.fs.cat_file(f)
    get_s = (time.perf_counter() - t) / max(1, len(metas))
    local = Path(tempfile.mkdtemp(prefix="gpudash-bench-list-"))
    # what the server does before its first full list, in a process of its own (this one runs moto)
    code = ("import sys, time\nfrom pathlib import Path\nfrom gpudash.store.runsync import RunsMirror\n"
            "import gpudash.store.listing as listing\n"
            "if sys.argv[3] == 'two': listing.run_json_copy = lambda data: None  # as before: run.json read too\n"
            "m = RunsMirror(sys.argv[1], Path(sys.argv[2]))\nt = time.perf_counter(); n = m.sync_once()\n"
            "print(time.perf_counter() - t, n)\n")
    out: dict[str, float] = {"listing_s": listing, "objects": len(found), "get_s": get_s}
    try:
        for how in ("one", "two"):  # one read a run (meta.json carrying run.json's copy), and two (as before)
            done = subprocess.run([sys.executable, "-c", code, PREFIX, str(local / how), how], capture_output=True,
                                  text=True, cwd=ROOT, check=True)
            sync_s, reads = done.stdout.split()[-2:]
            out["sync_s" if how == "one" else "sync_two_s"] = float(sync_s)
            out["reads" if how == "one" else "reads_two"] = float(reads)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return out


def serve_once(n: int) -> dict[str, float]:
    from helpers.s3 import free_port

    tmp = Path(tempfile.mkdtemp(prefix="gpudash-bench-serve-"))
    env = dict(os.environ, TMPDIR=str(tmp), GPUDASH_CACHE_DIR="off")
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", PREFIX, "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    api = f"http://127.0.0.1:{port}/api/runs"
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> None:  # CPU seconds so far of the server, and of this process (moto's S3 server runs here)
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["server_cpu_s"] = (int(fields[11]) + int(fields[12])) / tick
        t = os.times()
        out["moto_cpu_s"] = t.user + t.system - moto0
    t = os.times()
    moto0 = t.user + t.system
    try:
        while "port_s" not in out:  # the server's start-up: imports, the app built, the port bound
            if proc.poll() is not None or time.perf_counter() - t0 > 600:
                raise RuntimeError("the server did not start")
            try:
                _get(api + "?per_page=1")
                out["port_s"] = time.perf_counter() - t0
            except OSError:
                time.sleep(0.05)
        while True:
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("the server did not list every run within 600 s")
            try:
                body, _ = _get(api)
                if body["matching"] >= n:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        out["listed_s"] = time.perf_counter() - t0  # every run named (its row whole or said "listing")
        while True:  # the newest page whole (its runs' metadata read: they are read newest first)
            body, _ = _get(api)
            if not [r for r in body["runs"] if r["status"] == "listing"]:
                break
            if time.perf_counter() - t0 > 1200:
                raise RuntimeError("the server did not read the newest runs' metadata within 1200 s")
            time.sleep(0.25)
        out["first_page_s"] = time.perf_counter() - t0
        # every row whole (the seed finished); asked once a second, as the runs page does: a filter reads every
        # run's row, and asking more often would take the server's CPU from the listing it measures
        while _get(api + "?status=finished&per_page=1")[0]["matching"] < n:
            if time.perf_counter() - t0 > 1200:
                raise RuntimeError("the server did not read every run's metadata within 1200 s")
            time.sleep(1.0)
        out["complete_s"] = time.perf_counter() - t0
        cpu()
        body, out["api_runs_s"] = _get(api)
        _, out["api_runs_page2_s"] = _get(api + "?page=2")
        out["disk_listed"] = _du(tmp)
        run_id = body["runs"][0]["id"]
        summary, out["open_s"] = _get(f"{api}/{run_id}/summary", timeout=120)
        assert summary["steps"] > 0, summary
        out["disk_opened"] = _du(tmp)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def local_listing(n: int = 1000) -> dict[str, float]:
    """``/api/runs`` of a fresh server process over a local folder of ``n`` small runs (the summary store off)."""
    from benchmarks_many_runs import make_runs  # type: ignore[import-not-found]

    root = Path(tempfile.mkdtemp(prefix="gpudash-bench-local-"))
    try:
        runs = make_runs(root, n, steps=20)
        code = ("import sys, time\nfrom pathlib import Path\nfrom gpudash.server.app import create_app\n"
                "app = create_app(Path(sys.argv[1]))\nc = app.server.test_client()\n"
                "t = time.perf_counter(); r = c.get('/api/runs'); a = time.perf_counter() - t\n"
                "t = time.perf_counter(); c.get('/api/runs'); b = time.perf_counter() - t\n"
                "print(a, b, r.get_json()['matching'])\n")
        cold: list[float] = []
        for cache in ("off", str(root / "cache"), str(root / "cache")):
            env = dict(os.environ, GPUDASH_CACHE_DIR=cache)
            done = subprocess.run([sys.executable, "-c", code, str(runs)], env=env, capture_output=True, text=True,
                                  cwd=ROOT, check=True)
            a, b, matching = done.stdout.split()[-3:]
            assert int(matching) == n, done.stdout
            cold.append(float(a))
        return {"cold_s": cold[0], "cold_store_warm_s": cold[2], "warm_s": float(b)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, nargs="*", default=[300, 1000])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--no-local", action="store_true", help="skip the local folder of 1,000 runs")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import importlib

    sys.modules["benchmarks_many_runs"] = importlib.import_module("many_runs")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server, _ = start_moto()
    rows = []
    lines = []
    try:
        for n in sorted(args.runs):
            per_run, run_bytes = seed_bucket(n, args.steps)
            m = serve_once(n)
            cost = per_request_costs()
            rows.append((n, per_run, run_bytes, m, cost))
            print(f"N={n}: port {m['port_s']:.2f} s, first page whole {m['first_page_s']:.2f} s, every row "
                  f"{m['complete_s']:.2f} s; named in {m['listed_s']:.2f} s, /api/runs {m['api_runs_s']:.2f} s, open one run "
                  f"{m['open_s']:.2f} s, disk {m['disk_listed'] / 1e6:.2f} MB listed / {m['disk_opened'] / 1e6:.2f} MB "
                  f"one run opened; listing {cost['listing_s']:.2f} s ({cost['objects']} objects), "
                  f"one small GET {cost['get_s'] * 1000:.1f} ms, list+metadata {cost['sync_s']:.2f} s", flush=True)
    finally:
        server.stop()
    local = None if args.no_local else local_listing()
    if local:
        print(f"local folder of 1,000 runs: /api/runs cold {local['cold_s']:.2f} s (summary store off), "
              f"{local['cold_store_warm_s']:.2f} s (store warm), warm {local['warm_s']:.2f} s")
    lines.append(SECTION)
    lines.append("")
    lines.append(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
                 f"date {time.strftime('%Y-%m-%d')}; load average {os.getloadavg()[0]:.1f} at the end (a shared machine)."
                 )
    lines.append(f"Command: `.venv/bin/python benchmarks/bucket_runs.py --runs {' '.join(map(str, args.runs))}` "
                 f"(moto's S3 server in the same machine; one seed run of {args.steps} steps copied N times).")
    lines.append("")
    lines.append("| runs | objects | port answers | all named | first page whole | every row whole | `/api/runs` | "
                 "page 3 | open one run | disk listed | disk, one run opened | one listing of the prefix | "
                 "one small GET | listing + metadata |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, per_run, run_bytes, m, cost in rows:
        lines.append(f"| {n:,} | {n * per_run:,} ({n * run_bytes / 1e6:.0f} MB) | {m['port_s']:.2f} s | "
                     f"{m['listed_s']:.2f} s | {m['first_page_s']:.2f} s | {m['complete_s']:.2f} s | {m['api_runs_s']:.2f} s | {m['api_runs_page2_s']:.2f} s | "
                     f"{m['open_s']:.2f} s | {m['disk_listed'] / 1e6:.3f} MB | {m['disk_opened'] / 1e6:.2f} MB | "
                     f"{cost['listing_s']:.2f} s | {cost['get_s'] * 1000:.1f} ms | {cost['sync_s']:.2f} s |")
    if rows:
        n, per_run, _b, m, cost = rows[-1]
        lines.append("")
        per_run_s = (m["complete_s"] - m["port_s"]) / n
        lines.append(f"Where the time goes ({n:,} runs): the server's start-up until its port answers "
                     f"{m['port_s']:.2f} s (imports, the app); then the listing and the metadata, "
                     f"{m['complete_s'] - m['port_s']:.2f} s to every row whole ({per_run_s * 1000:.2f} ms a run): one listing of the "
                     f"prefix ({cost['listing_s']:.2f} s for {cost['objects']:,} objects, pages of 1,000 one after "
                     f"the other, {cost['listing_s'] / cost['objects'] * 1e6:.0f} µs an object) and one small GET a "
                     f"run (its rank's meta.json, which carries run.json's copy; {cost['get_s'] * 1000:.1f} ms "
                     f"alone, {FETCHERS} in flight at once).")
        lines.append(f"Listing + metadata in a process of its own, the same bucket, one after the other: "
                     f"{cost['sync_s']:.2f} s reading {cost['reads']:.0f} objects (each run's meta.json, carrying "
                     f"run.json's copy) against {cost['sync_two_s']:.2f} s reading {cost['reads_two']:.0f} (run.json "
                     f"read too, as before): {cost['sync_two_s'] / cost['sync_s']:.2f}x.")
        lines.append(f"CPU time until every row was whole: the server {m['server_cpu_s']:.1f} s (start-up "
                     f"included), moto's S3 server and this benchmark's polling {m['moto_cpu_s']:.1f} s: on a quiet "
                     "machine with two free CPUs the wall time would be near the larger of the two.")
        if n < 10_000:
            named = (m["listed_s"] - m["port_s"]) / n
            lines.append(f"10,000 runs on paper (linear in the runs past start-up): every row whole after about "
                         f"{m['port_s']:.1f} s + 10,000 x {per_run_s * 1000:.2f} ms = "
                         f"{m['port_s'] + 10_000 * per_run_s:.0f} s; every run named after about "
                         f"{m['port_s'] + 10_000 * named:.0f} s (the listing alone).")
    if local:
        lines.append("")
        lines.append(f"Local folder of 1,000 runs (20 steps each), `/api/runs` on a fresh server process: "
                     f"{local['cold_s']:.2f} s with the summary store off, {local['cold_store_warm_s']:.2f} s with it "
                     f"warm, {local['warm_s']:.2f} s the second request.")
    text = "\n".join(lines)
    print(text)
    if args.write:
        results.write_section(SECTION, text)


if __name__ == "__main__":
    main()
