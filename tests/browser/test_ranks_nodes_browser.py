"""The Ranks section of a 64-rank, 8-node run in a real browser: the heat map renders, the slow node is named."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from helpers.browser import rendered, severe_logs, wait_for


def _record(run_dir: Path, ranks: int = 64, steps: int = 30) -> None:
    """Rows as 64 DDP ranks on 8 nodes write them (node03's ranks late in data, the rest waiting in backward),
    straight through the writer."""
    from gpudash.store.meta import write_run_meta
    from gpudash.store.writer import Recorder

    run_dir.mkdir(parents=True)
    write_run_meta(run_dir, {"name": run_dir.name, "world_size": ranks})
    for r in range(ranks):
        node = f"node{r // 8:02d}"
        rec = Recorder(run_dir, rank=r, meta={"node": node, "world_size": ranks, "local_rank": r % 8})
        for step in range(steps):
            data = 0.02 + (0.015 if node == "node03" else 0.0) + 0.0001 * (r % 3)
            backward = 0.03 + 0.035 - data
            rec.put("steps", {"step": step, "time": 1000.0 + step * 0.07, "duration_s": data + 0.01 + backward,
                              "data_s": data, "forward_s": 0.01, "backward_s": backward, "samples": 8})
        rec.close()


def test_many_ranks_heatmap_and_slow_node(driver: Any, tmp_path: Path, artifacts: Path) -> None:
    from gpudash.server.app import serve_in_thread

    _record(tmp_path / "fleet")
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    try:
        driver.get(url + "run/fleet")
        wait_for(lambda: rendered(driver, "rank-heatmap"), what="the rank x step heat map")
        rows = driver.execute_script(
            "const d = document.querySelector('#rank-heatmap .js-plotly-plot').data[0];"
            "return [d.type, d.y.length, d.x.length, d.y[24]];")
        assert rows == ["heatmap", 64, 30, "node03 · 24"]
        assert "node node03: all 8 ranks (24–31)" in driver.find_element("id", "top-stragglers").text
        assert "node node03 (all 8 ranks" in driver.find_element("id", "straggler-lights").text
        assert not driver.find_elements("id", "rank-step-graph")
        driver.execute_script("document.getElementById('ranks-view').scrollIntoView(); window.scrollBy(0, -90)")
        time.sleep(0.3)
        driver.save_screenshot(str(artifacts / "run-page-ranks-64.png"))
        assert severe_logs(driver) == []
    finally:
        stop()
