"""The host chart draws memory by process (main, each worker, /dev/shm) in a panel of its own."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudash.server.layouts.device import host_series


def test_workers_in_their_own_panel_named_by_slot() -> None:
    h = pd.DataFrame({"time": np.arange(3.0), "rank": 0, "cpu_pct": 1.0, "rss_bytes": 1e8, "available_bytes": 8e9,
                      "main_pss_bytes": 1e8, "child0_pss_bytes": 5e7, "child1_pss_bytes": 6e7,
                      "child0_uss_bytes": 4e7, "children_pss_bytes": 1.1e8, "shm_used_bytes": 1e6})
    by = {s.col: s for s in host_series(h)}
    assert by["child1_pss_bytes"].name == "worker 1 PSS" and by["main_pss_bytes"].name == "main PSS"
    panel = {by[c].yaxis for c in ("main_pss_bytes", "child0_pss_bytes", "child1_pss_bytes", "shm_used_bytes")}
    assert len(panel) == 1 and panel.isdisjoint({by["rss_bytes"].yaxis, by["available_bytes"].yaxis})
    assert "child0_uss_bytes" not in by  # PSS is drawn: USS is in the rows and the facts
