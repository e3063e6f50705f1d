"""The straggler verdict on two real ranks writing side by side (rank 1 sleeps in its data phase)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gpudash
from gpudash.analysis import summarize


def test_slow_rank_is_named(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    # opened one after the other: two Monitors in one process share a pid (real ranks do not)
    monitors = [Monitor(tmp_path / "ddp", rank=r, world_size=2, host_hz=0, handle_signals=False) for r in (0, 1)]

    def rank(r: int) -> None:
        with monitors[r] as mon:
            for _ in range(25):
                with mon.step(samples=1):
                    with mon.phase("data"):
                        time.sleep(0.02 if r == 1 else 0.001)
                    with mon.phase("forward"):
                        time.sleep(0.005)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run = gpudash.load_run(tmp_path / "ddp")
    assert run.ranks == [0, 1]
    v = {x.kind: x for x in summarize(run)}["straggler"]
    assert v.title == "Rank 1 is a straggler" and v.numbers["skew_ratio_median"] > 0.5
