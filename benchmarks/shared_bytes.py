"""Bytes put on shared storage per training step, early and late in a run: whole copies (gpudash <= the
segments change) against append-only segments, beside what the local store writes per step.

    .venv/bin/python benchmarks/shared_bytes.py [--seconds 60] [--step-ms 2] [--interval 3]

One process records a loop of ``--step-ms`` steps (4 logged scalars, phases off, host sampler off) with
``GPUDASH_SHARED_FS=1`` into a temporary run folder, publishing every ``--interval`` s. Columns, each for the
first and the last third of the run:

* local: ``write()`` bytes of the process per step in a run of the same loop without publishing
  (``wchar`` of ``/proc/self/io``: the SQLite database and its log, what the local store writes);
* copies: the bytes a whole copy would put at each publish (the live database's size then, as the copy
  publisher wrote it: ``PRAGMA page_count`` x page size) per step;
* segments: the bytes the segment publisher put on the store (Parquet segments, merges and meta.json;
  ``SegmentPublisher.bytes_put``) per step.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from gpudash.monitor import Monitor
from gpudash.store import publish


def _wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar"):
                return int(line.split()[1])
    return 0


def _loop(run_dir: Path, seconds: float, step_s: float, sample) -> list[tuple[float, int, float, float]]:
    """(seconds in, steps, local write() bytes, publisher's bytes) at each sample; ``sample(mon)`` adds the copy size."""
    out = []
    mon = Monitor(run_dir, flush_interval=0.5, host_hz=0.0, handle_signals=False)
    t0 = time.monotonic()
    w0 = _wchar()
    step, next_sample = 0, 1.0
    while (now := time.monotonic() - t0) < seconds:
        with mon.step(samples=4):
            mon.log(loss=1.0 / (step + 1), lr=1e-3, grad_norm=0.5 + step % 7, tokens=1024)
            time.sleep(step_s)
        step += 1
        if now >= next_sample:
            next_sample += 1.0
            out.append((now, step, float(_wchar() - w0), *sample(mon)))
    mon.close()
    return out


def _per_step(samples: list, col: int, part: str) -> float:
    n = len(samples)
    a, b = (samples[0], samples[n // 3]) if part == "early" else (samples[2 * n // 3], samples[-1])
    return (b[col] - a[col]) / max(1, b[1] - a[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=3.0)
    args = ap.parse_args()
    publish.PUBLISH_INTERVAL_S = args.interval
    with tempfile.TemporaryDirectory(prefix="gpudash-shared-bytes-") as tmp:
        os.environ["GPUDASH_SHARED_FS"] = "0"
        local = _loop(Path(tmp) / "local", args.seconds, args.step_ms / 1000, lambda mon: (0.0, 0.0))
        os.environ["GPUDASH_SHARED_FS"] = "1"
        os.environ["GPUDASH_LOCAL_DIR"] = str(Path(tmp) / "node")
        copies = {"bytes": 0.0, "at": 0.0}

        def sample(mon: Monitor) -> tuple[float, float]:
            pub = mon.recorder._publisher
            assert pub is not None
            if pub.published_at != copies["at"]:  # a publish happened: a whole copy would have put the db
                copies["at"] = pub.published_at
                with sqlite3.connect(f"file:{pub.live_path}?mode=ro", uri=True) as conn:
                    pages = conn.execute("PRAGMA page_count").fetchone()[0]
                    size = conn.execute("PRAGMA page_size").fetchone()[0]
                copies["bytes"] += pages * size
            return copies["bytes"], float(pub.bytes_put)

        shared = _loop(Path(tmp) / "shared", args.seconds, args.step_ms / 1000, sample)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%d')}: {args.seconds:g} s, {args.step_ms:g} ms steps, publish every "
          f"{args.interval:g} s; {local[-1][1]:,} / {shared[-1][1]:,} steps")
    print(f"{'bytes per step':<16}{'local':>10}{'copies':>10}{'segments':>10}{'segments/local':>16}")
    for part in ("early", "late"):
        lo = _per_step(local, 2, part)
        cp = _per_step(shared, 3, part)
        sg = _per_step(shared, 4, part)
        print(f"{part + ' third':<16}{lo:>10.0f}{cp:>10.0f}{sg:>10.0f}{sg / lo:>16.2f}")
    late_early = _per_step(shared, 4, "late") / max(1e-9, _per_step(shared, 4, "early"))
    copy_growth = _per_step(shared, 3, "late") / max(1e-9, _per_step(shared, 3, "early"))
    print(f"late / early: segments {late_early:.2f}x, copies {copy_growth:.2f}x")


if __name__ == "__main__":
    main()
